// plugins/comms/mpi — the "mpi" Communicator (dew/comm.hpp) over Open MPI (any MPI-3 library).
//
// Lifetime: the first communicator created initialises MPI (MPI_Init_thread, MPI_THREAD_FUNNELED: every
// MPI call comes from the thread that created it, the trainer's) and registers MPI_Finalize with
// atexit — plugin libraries are never unloaded, so the handler stays valid; later communicators share
// that state. Works without mpirun too (a singleton job of size 1).
// Collectives run on a duplicate of MPI_COMM_WORLD with MPI_ERRORS_RETURN, so a failure comes back as a
// code instead of killing the process silently. Every collective is non-blocking underneath
// (MPI_Iallreduce, MPI_Ibcast, MPI_Iallgather, MPI_Ibarrier) and completed by polling MPI_Test, which
// is what gives the timeout: waiting on a collective for longer than `timeout` seconds (option, else
// DEW_DIST_TIMEOUT, else 60; 0 = no limit) means a peer died or hangs: the rank prints
//   dew: rank R of N: <op> did not complete within T s (a peer died, hangs or is far behind); stopping
// and calls MPI_Abort (mpirun then ends every rank), falling back to _Exit after 10 s. An MPI error code
// does the same with the library's message. When mpirun itself ends the job because one rank died (its
// usual reaction to a killed process), the survivors get SIGTERM: a handler prints one line saying so
// before the default action.
// Memory: tensors on host backends are handed to MPI directly; others are staged through host buffers.
// all_reduce_sum and reduce_scatter_sum support f32 and f64. Uneven pieces map onto MPI_Ireduce_scatter
// (recvcounts) and MPI_Iallgatherv; a piece (and an all-gather in all) is limited to 2^31 elements/bytes.
#include <mpi.h>
#include <unistd.h>

#include <chrono>
#include <climits>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dew/backend.hpp>
#include <dew/comm.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <string>
#include <memory>
#include <thread>
#include <vector>

namespace {

struct MpiState {
  bool ready = false;
  MPI_Comm comm = MPI_COMM_NULL;
  int rank = 0, size = 1;
};
MpiState g_mpi;
char g_term_message[256];

void on_sigterm(int sig) {
  // async-signal-safe: write() and re-raise with the default action
  ssize_t ignored = write(STDERR_FILENO, g_term_message, std::strlen(g_term_message));
  (void)ignored;
  std::signal(sig, SIG_DFL);
  std::raise(sig);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

[[noreturn]] void stop_job(int code, const std::string& message) {
  if (!message.empty()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
  // MPI_Abort asks the launcher to end every rank (this one too, by SIGTERM: no second message);
  // should the runtime itself be wedged, leave anyway.
  std::signal(SIGTERM, SIG_DFL);
  std::thread([code] {
    std::this_thread::sleep_for(std::chrono::seconds(10));
    std::_Exit(code);
  }).detach();
  MPI_Abort(g_mpi.comm != MPI_COMM_NULL ? g_mpi.comm : MPI_COMM_WORLD, code);
  std::_Exit(code);
}

std::string who() { return "dew: rank " + std::to_string(g_mpi.rank) + " of " + std::to_string(g_mpi.size); }

void check_rc(int rc, const char* op) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  stop_job(1, who() + ": MPI error in " + op + ": " + std::string(text, size_t(len)) +
                  " (a peer died or the network failed); stopping");
}

void init_mpi() {
  if (g_mpi.ready) return;
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    const int rc = MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    DEW_CHECK(rc == MPI_SUCCESS, "mpi: MPI_Init_thread failed (code ", rc, ")");
    std::atexit(finalize_at_exit);
  }
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  check_rc(MPI_Comm_dup(MPI_COMM_WORLD, &g_mpi.comm), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(g_mpi.comm, MPI_ERRORS_RETURN);
  MPI_Comm_rank(g_mpi.comm, &g_mpi.rank);
  MPI_Comm_size(g_mpi.comm, &g_mpi.size);
  g_mpi.ready = true;
  if (g_mpi.size > 1) {
    std::snprintf(g_term_message, sizeof g_term_message,
                  "dew: rank %d of %d: terminated by SIGTERM (mpirun ends every rank when one fails, see its "
                  "message, or on Ctrl-C; kill -USR1 <mpirun pid> pauses with a checkpoint)\n",
                  g_mpi.rank, g_mpi.size);
    struct sigaction current {};
    if (sigaction(SIGTERM, nullptr, &current) == 0 && current.sa_handler == SIG_DFL) std::signal(SIGTERM, on_sigterm);
  }
}

MPI_Datatype float_type(dew::DType t, const char* op) {
  switch (t) {
    case dew::DType::f32:
      return MPI_FLOAT;
    case dew::DType::f64:
      return MPI_DOUBLE;
    default:
      break;
  }
  DEW_CHECK(false, "mpi: ", op, " supports f32 and f64 tensors, got ", dew::dtype_name(t));
  return MPI_DATATYPE_NULL;
}

// A tensor's bytes as MPI sees them: its own memory on host backends, else a host copy.
class HostView {
 public:
  HostView(const dew::Tensor& t, bool load) : tensor_(t) {
    if (t.backend().host_accessible()) {
      ptr_ = static_cast<unsigned char*>(t.data());
    } else {
      staged_.resize(t.nbytes());
      if (load) t.copy_to_host(staged_.data());
      ptr_ = staged_.data();
    }
  }
  unsigned char* data() const { return ptr_; }
  void store() {  // after the operation: back into the tensor when staged
    if (!staged_.empty()) tensor_.copy_from_host(staged_.data());
  }

 private:
  dew::Tensor tensor_;
  std::vector<unsigned char> staged_;
  unsigned char* ptr_ = nullptr;
};

// Polls requests to completion; stops the job when wait() lasts longer than the timeout.
class Pending {
 public:
  Pending(const char* op, double timeout) : op_(op), timeout_(timeout) {}
  std::vector<MPI_Request>& requests() { return requests_; }

  bool test() {
    if (done_) return true;
    int flag = 0;
    check_rc(MPI_Testall(int(requests_.size()), requests_.data(), &flag, MPI_STATUSES_IGNORE), op_);
    done_ = flag != 0;
    return done_;
  }

  // The timeout counts from here, not from the launch: a rank may compute for long between launching
  // an operation and waiting for it.
  void wait() {
    const auto start = std::chrono::steady_clock::now();
    int polls = 0;
    while (!test()) {
      // Spin briefly (latency), then poll every ~50 us so that oversubscribed ranks leave the core.
      if (++polls > 2000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if (timeout_ > 0 && (polls & 63) == 0) {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (waited > timeout_) {
          char t[32];
          std::snprintf(t, sizeof t, "%g", timeout_);
          stop_job(1, who() + ": " + op_ + " did not complete within " + t +
                          " s (a peer died, hangs or is far behind); stopping");
        }
      }
    }
  }

 private:
  const char* op_;
  double timeout_;
  std::vector<MPI_Request> requests_;
  bool done_ = false;
};

// Splits [0, count) into pieces MPI's int counts can take.
// An empty tensor still takes part (one call with count 0): every rank issues the same sequence.
template <class F>
void in_chunks(int64_t count, F&& f) {
  const int64_t max_chunk = int64_t(1) << 30;
  if (count == 0) f(int64_t(0), 0);
  for (int64_t off = 0; off < count; off += max_chunk) f(off, int(std::min(max_chunk, count - off)));
}

// A launched collective: its requests and the host views of its tensors; completion stores the views
// that receive a result back into their tensors (staged ones only; host memory already holds it).
class MpiRequest final : public dew::CommRequest {
 public:
  MpiRequest(const char* op, double timeout) : pending_(op, timeout) {}
  // A view of `t`: `load` copies the tensor into a staging buffer first; `result` stores it back after.
  HostView& view(const dew::Tensor& t, bool load, bool result) {
    views_.push_back(std::make_unique<HostView>(t, load));
    if (result) results_.push_back(views_.back().get());
    return *views_.back();
  }
  Pending& pending() { return pending_; }
  bool test() override {
    if (!pending_.test()) return false;
    finish();
    return true;
  }
  void wait() override {
    pending_.wait();
    finish();
  }

 private:
  void finish() {
    if (stored_) return;
    for (HostView* v : results_) v->store();
    stored_ = true;
  }
  std::vector<std::unique_ptr<HostView>> views_;
  std::vector<HostView*> results_;
  Pending pending_;
  bool stored_ = false;
};

// Element counts (and offsets) as MPI's ints, refused clearly beyond them.
std::vector<int> mpi_counts(const std::vector<int64_t>& counts, int64_t scale, const char* op) {
  std::vector<int> out;
  for (int64_t c : counts) {
    DEW_CHECK(c * scale <= int64_t(INT_MAX), "mpi: ", op, ": a piece of more than 2^31 units is not supported");
    out.push_back(int(c * scale));
  }
  return out;
}
std::vector<int> displacements(const std::vector<int>& counts, const char* op) {
  std::vector<int> d;
  int64_t at = 0;
  for (int c : counts) {
    DEW_CHECK(at <= int64_t(INT_MAX), "mpi: ", op, ": more than 2^31 units in all is not supported");
    d.push_back(int(at));
    at += c;
  }
  return d;
}

class MpiCommunicator final : public dew::Communicator {
 public:
  explicit MpiCommunicator(const dew::Options& o) {
    timeout_ = dew::communicator_timeout(o, "mpi");
    init_mpi();
  }

  std::string name() const override { return "mpi"; }
  int rank() const override { return g_mpi.rank; }
  int size() const override { return g_mpi.size; }
  double timeout() const override { return timeout_; }

  void all_reduce_sum(dew::Tensor& t) override { all_reduce_sum_async(t)->wait(); }

  std::shared_ptr<dew::CommRequest> all_reduce_sum_async(dew::Tensor& t) override {
    const MPI_Datatype type = float_type(t.dtype(), "all_reduce_sum");
    auto req = std::make_shared<MpiRequest>("all_reduce_sum", timeout_);
    HostView& view = req->view(t, true, true);
    const size_t esize = dew::dtype_size(t.dtype());
    in_chunks(t.numel(), [&](int64_t off, int n) {
      MPI_Request r;
      unsigned char* data = view.data() + off * int64_t(esize);
      check_rc(MPI_Iallreduce(MPI_IN_PLACE, data, n, type, MPI_SUM, g_mpi.comm, &r), "MPI_Iallreduce");
      req->pending().requests().push_back(r);
    });
    return req;
  }

  void broadcast(dew::Tensor& t, int root) override { broadcast_async(t, root)->wait(); }

  std::shared_ptr<dew::CommRequest> broadcast_async(dew::Tensor& t, int root) override {
    DEW_CHECK(root >= 0 && root < g_mpi.size, "mpi: broadcast root ", root, " is not a rank of ", g_mpi.size);
    auto req = std::make_shared<MpiRequest>("broadcast", timeout_);
    HostView& v = req->view(t, g_mpi.rank == root, g_mpi.rank != root);
    in_chunks(int64_t(t.nbytes()), [&](int64_t off, int n) {
      MPI_Request r;
      check_rc(MPI_Ibcast(v.data() + off, n, MPI_BYTE, root, g_mpi.comm, &r), "MPI_Ibcast");
      req->pending().requests().push_back(r);
    });
    return req;
  }

  void all_gather(const dew::Tensor& in, dew::Tensor& out) override {
    DEW_CHECK(in.dtype() == out.dtype() && out.nbytes() == in.nbytes() * size_t(g_mpi.size),
              "mpi: all_gather needs out of ", g_mpi.size, " x the input's size and the same dtype");
    DEW_CHECK(in.nbytes() <= size_t(INT_MAX), "mpi: all_gather of more than 2 GiB per rank is not supported");
    HostView src(in, true), dst(out, false);
    Pending p("all_gather", timeout_);
    MPI_Request r;
    check_rc(
        MPI_Iallgather(src.data(), int(in.nbytes()), MPI_BYTE, dst.data(), int(in.nbytes()), MPI_BYTE, g_mpi.comm, &r),
        "MPI_Iallgather");
    p.requests().push_back(r);
    p.wait();
    dst.store();
  }

  std::shared_ptr<dew::CommRequest> all_gather_async(const dew::Tensor& in, dew::Tensor& out,
                                                    const std::vector<int64_t>& counts) override {
    DEW_CHECK(in.dtype() == out.dtype(), "mpi: all_gather needs the same dtype in and out");
    const std::vector<int64_t> c = dew::collective_counts(counts, out.numel(), g_mpi.size, "all_gather", "mpi");
    DEW_CHECK(in.numel() == c[size_t(g_mpi.rank)], "mpi: all_gather: rank ", g_mpi.rank, " contributes ",
              in.numel(), " elements, its count is ", c[size_t(g_mpi.rank)]);
    const int64_t esize = int64_t(dew::dtype_size(in.dtype()));
    const std::vector<int> bytes = mpi_counts(c, esize, "all_gather");
    const std::vector<int> displs = displacements(bytes, "all_gather");
    auto req = std::make_shared<MpiRequest>("all_gather", timeout_);
    HostView& src = req->view(in, true, false);
    HostView& dst = req->view(out, false, true);
    MPI_Request r;
    check_rc(MPI_Iallgatherv(src.data(), bytes[size_t(g_mpi.rank)], MPI_BYTE, dst.data(), bytes.data(), displs.data(),
                             MPI_BYTE, g_mpi.comm, &r),
             "MPI_Iallgatherv");
    req->pending().requests().push_back(r);
    return req;
  }

  std::shared_ptr<dew::CommRequest> reduce_scatter_sum_async(const dew::Tensor& in, dew::Tensor& out,
                                                            const std::vector<int64_t>& counts) override {
    const MPI_Datatype type = float_type(in.dtype(), "reduce_scatter_sum");
    DEW_CHECK(in.dtype() == out.dtype(), "mpi: reduce_scatter_sum needs the same dtype in and out");
    const std::vector<int64_t> c = dew::collective_counts(counts, in.numel(), g_mpi.size, "reduce_scatter_sum", "mpi");
    DEW_CHECK(out.numel() == c[size_t(g_mpi.rank)], "mpi: reduce_scatter_sum: rank ", g_mpi.rank, " receives ",
              c[size_t(g_mpi.rank)], " elements into a tensor of ", out.numel());
    const std::vector<int> n = mpi_counts(c, 1, "reduce_scatter_sum");
    auto req = std::make_shared<MpiRequest>("reduce_scatter_sum", timeout_);
    HostView& src = req->view(in, true, false);
    HostView& dst = req->view(out, false, true);
    MPI_Request r;
    check_rc(MPI_Ireduce_scatter(src.data(), dst.data(), n.data(), type, MPI_SUM, g_mpi.comm, &r),
             "MPI_Ireduce_scatter");
    req->pending().requests().push_back(r);
    return req;
  }

  void barrier() override {
    Pending p("barrier", timeout_);
    MPI_Request r;
    check_rc(MPI_Ibarrier(g_mpi.comm, &r), "MPI_Ibarrier");
    p.requests().push_back(r);
    p.wait();
  }

  [[noreturn]] void abort(int code, const std::string& message) override { stop_job(code, message); }

 private:
  double timeout_ = 60.0;
};

}  // namespace

#ifdef OMPI_MAJOR_VERSION
#define DEW_MPI_NOTES                                                                  \
  "Open MPI " DEW_STR(OMPI_MAJOR_VERSION) "." DEW_STR(OMPI_MINOR_VERSION) "." DEW_STR( \
      OMPI_RELEASE_VERSION) " (MPI " DEW_STR(MPI_VERSION) "." DEW_STR(MPI_SUBVERSION) ")"
#else
#define DEW_MPI_NOTES "MPI " DEW_STR(MPI_VERSION) "." DEW_STR(MPI_SUBVERSION)
#endif
DEW_PLUGIN_WITH_NOTES("mpi", "0.1.0", DEW_MPI_NOTES) {
  registrar.add<dew::Communicator>(
      {.name = "mpi",
       .description = "MPI collectives (Open MPI): data-parallel training across processes and hosts, launched "
                      "with mpirun",
       .factory = [](const dew::Options& o) { return std::make_shared<MpiCommunicator>(o); },
       .probe = {},
       .options = {{"timeout", "60",
                    "seconds a collective may take before the rank stops the job (0 = no limit; env "
                    "DEW_DIST_TIMEOUT)"}}});
}
