// tests/dist/collectives.cpp — the sharded data parallel's collectives between real processes: run under
// `mpirun -np N` (N = 2, 3) it checks reduce_scatter_sum, all_gather (with counts) and broadcast_async
// of the mpi communicator on the ref and cpu backends: equal, uneven and empty pieces, f32/f64 sums and
// raw-byte gathers of integer tensors, several operations in flight completed in another order, and
// counts that do not fit refused with an error. Values are small integers, so every sum is exact and
// the checks are equalities. Exit status 0 only when every check on this rank passed.
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "dew/backend.hpp"
#include "dew/comm.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"
#include "dew/tensor.hpp"

namespace {

int g_failures = 0;
int g_rank = 0;

void expect(bool ok, const std::string& what) {
  if (ok) return;
  ++g_failures;
  std::fprintf(stderr, "rank %d: FAILED: %s\n", g_rank, what.c_str());
}

// The value rank r holds at element i of the full input: distinct per (r, i), exact in f32.
double value(int r, int64_t i) { return double(r + 1) * 1000.0 + double(i); }

std::vector<int64_t> offsets_of(const std::vector<int64_t>& counts) {
  std::vector<int64_t> at{0};
  for (int64_t c : counts) at.push_back(at.back() + c);
  return at;
}

void check_reduce_scatter(dew::Communicator& comm, const dew::BackendPtr& be, dew::DType dt,
                          const std::vector<int64_t>& counts, const std::string& label) {
  const int world = comm.size(), rank = comm.rank();
  const std::vector<int64_t> c =
      counts.empty() ? std::vector<int64_t>(size_t(world), 4) : counts;  // equal: 4 each
  const std::vector<int64_t> at = offsets_of(c);
  std::vector<double> in(size_t(at.back()));
  for (int64_t i = 0; i < at.back(); ++i) in[size_t(i)] = value(rank, i);
  std::vector<float> in32(in.begin(), in.end());
  dew::Tensor tin = dt == dew::DType::f64 ? dew::Tensor::from_host(in.data(), {at.back()}, dt, be)
                                          : dew::Tensor::from_vector(in32, {at.back()}, be);
  dew::Tensor out = dew::Tensor::zeros({c[size_t(rank)]}, dt, be);
  comm.reduce_scatter_sum(tin, out, counts);
  const std::vector<double> got = out.to_doubles();
  bool ok = int64_t(got.size()) == c[size_t(rank)];
  for (int64_t j = 0; ok && j < c[size_t(rank)]; ++j) {
    double want = 0;
    for (int r = 0; r < world; ++r) want += value(r, at[size_t(rank)] + j);
    ok = got[size_t(j)] == want;
  }
  expect(ok, "reduce_scatter_sum " + label);
  expect(tin.to_doubles() == in, "reduce_scatter_sum leaves its input unchanged " + label);
}

void check_all_gather(dew::Communicator& comm, const dew::BackendPtr& be, const std::vector<int64_t>& counts,
                      const std::string& label) {
  const int world = comm.size(), rank = comm.rank();
  const std::vector<int64_t> c = counts.empty() ? std::vector<int64_t>(size_t(world), 3) : counts;
  const std::vector<int64_t> at = offsets_of(c);
  std::vector<int32_t> mine;
  for (int64_t j = 0; j < c[size_t(rank)]; ++j) mine.push_back(int32_t(value(rank, j)));
  dew::Tensor in = dew::Tensor::from_host(mine.data(), {int64_t(mine.size())}, dew::DType::i32, be);
  dew::Tensor out = dew::Tensor::zeros({at.back()}, dew::DType::i32, be);
  comm.all_gather_async(in, out, counts)->wait();
  const std::vector<int32_t> got = out.to_ints();
  bool ok = int64_t(got.size()) == at.back();
  for (int r = 0; ok && r < world; ++r)
    for (int64_t j = 0; ok && j < c[size_t(r)]; ++j) ok = got[size_t(at[size_t(r)] + j)] == int32_t(value(r, j));
  expect(ok, "all_gather " + label);
}

// Three operations in flight at once, completed in reverse order of launch.
void check_in_flight(dew::Communicator& comm, const dew::BackendPtr& be) {
  const int world = comm.size(), rank = comm.rank();
  const int64_t n = 5;
  std::vector<float> full(size_t(n * world));
  for (size_t i = 0; i < full.size(); ++i) full[i] = float(value(rank, int64_t(i)));
  dew::Tensor rs_in = dew::Tensor::from_vector(full, {n * world}, be), rs_out = dew::Tensor::zeros({n}, dew::DType::f32, be);
  std::vector<float> piece(size_t(n), float(rank + 7));
  dew::Tensor ag_in = dew::Tensor::from_vector(piece, {n}, be), ag_out = dew::Tensor::zeros({n * world}, dew::DType::f32, be);
  const int root = world - 1;
  std::vector<float> b(size_t(n), rank == root ? 42.0f : -1.0f);
  dew::Tensor bc = dew::Tensor::from_vector(b, {n}, be);
  auto r1 = comm.reduce_scatter_sum_async(rs_in, rs_out, {});
  auto r2 = comm.all_gather_async(ag_in, ag_out, {});
  auto r3 = comm.broadcast_async(bc, root);
  r3->wait();
  r2->wait();
  while (!r1->test()) {
  }
  expect(bc.to_floats() == std::vector<float>(size_t(n), 42.0f), "broadcast_async from the last rank");
  std::vector<float> ag_want;
  for (int r = 0; r < world; ++r) ag_want.insert(ag_want.end(), size_t(n), float(r + 7));
  expect(ag_out.to_floats() == ag_want, "all_gather_async in flight with others");
  bool ok = true;
  const std::vector<float> got = rs_out.to_floats();
  for (int64_t j = 0; j < n; ++j) {
    double want = 0;
    for (int r = 0; r < world; ++r) want += value(r, rank * n + j);
    ok = ok && got[size_t(j)] == float(want);
  }
  expect(ok, "reduce_scatter_sum_async in flight with others");
}

void check_refusals(dew::Communicator& comm, const dew::BackendPtr& be) {
  const int world = comm.size();
  dew::Tensor in = dew::Tensor::zeros({7}, dew::DType::f32, be), out = dew::Tensor::zeros({1}, dew::DType::f32, be);
  auto refused = [&](auto&& f, const std::string& label) {
    bool threw = false;
    try {
      f();
    } catch (const dew::Error&) {
      threw = true;
    }
    expect(threw, "refused: " + label);
  };
  if (world > 1 && 7 % world != 0) refused([&] { comm.reduce_scatter_sum(in, out); }, "7 elements in equal pieces");
  refused([&] { comm.reduce_scatter_sum(in, out, std::vector<int64_t>(size_t(world), 1)); }, "counts not adding up");
  refused([&] { comm.all_gather_async(in, out, {7}); }, "one count for several ranks");
  dew::Tensor ints = dew::Tensor::zeros({int64_t(world)}, dew::DType::i32, be);
  dew::Tensor one = dew::Tensor::zeros({1}, dew::DType::i32, be);
  refused([&] { comm.reduce_scatter_sum(ints, one); }, "an integer sum");
}

}  // namespace

int main() {
  try {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref", "cpu", "mpi"});
    auto comm = dew::Registry::global().create<dew::Communicator>("mpi", dew::Options{});
    g_rank = comm->rank();
    const int world = comm->size();
    for (const char* backend : {"ref", "cpu"}) {
      const dew::BackendPtr be = dew::create_backend(backend);
      const std::string on = std::string(" on ") + backend;
      std::vector<int64_t> uneven;  // 3, 0, 5, 1, ... : one empty piece, the rest uneven
      for (int r = 0; r < world; ++r) uneven.push_back(r == 1 ? 0 : 2 * r + 3);
      std::vector<int64_t> one_owner(size_t(world), 0);  // a whole parameter owned by the last rank
      one_owner.back() = 9;
      for (dew::DType dt : {dew::DType::f32, dew::DType::f64}) {
        const std::string t = std::string(" ") + dew::dtype_name(dt) + on;
        check_reduce_scatter(*comm, be, dt, {}, "equal" + t);
        check_reduce_scatter(*comm, be, dt, uneven, "uneven" + t);
        check_reduce_scatter(*comm, be, dt, one_owner, "one owner" + t);
      }
      check_all_gather(*comm, be, {}, "equal" + on);
      check_all_gather(*comm, be, uneven, "uneven" + on);
      check_all_gather(*comm, be, one_owner, "one owner" + on);
      check_in_flight(*comm, be);
      check_refusals(*comm, be);
    }
    comm->barrier();
    if (g_failures == 0 && g_rank == 0) std::printf("collectives: all checks passed on %d ranks\n", world);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: error: %s\n", g_rank, e.what());
    return 1;
  }
  return g_failures == 0 ? 0 : 1;
}
