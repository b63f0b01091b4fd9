// plugins/comms/nccl — the "nccl" Communicator (dew/comm.hpp): NCCL collectives on GPU memory, for
// data-parallel training with the cuda backend (`[run] dist = nccl`).
//
// Bootstrap (rank, size and NCCL's unique id), in this order:
//   1. launched by mpirun (or MPI already initialised) and built with MPI: MPI_COMM_WORLD's rank and
//      size, the id broadcast with MPI_Bcast (`mpirun -np 8 dew-run train ... --run.dist nccl`);
//   2. RANK / WORLD_SIZE in the environment (torchrun-style launchers) with DEW_NCCL_RENDEZVOUS naming a
//      folder every rank can read (shared file system): rank 0 writes the id there (temporary name, then
//      rename), the others poll for it up to the timeout;
//   3. otherwise a job of one process.
// Device: the process's local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, MPI_LOCALRANKID,
// SLURM_LOCALID) modulo the visible devices, which is also the cuda backend's automatic choice; every
// collective checks that its tensor lives on that device.
// Collectives run on the communicator's own stream; the caller has synchronised the backend's stream
// before (the data-parallel trainer does), and wait() synchronises the host with the collective, so the
// backend's next kernels see the result. Waiting longer than `timeout` seconds (option, else
// DEW_DIST_TIMEOUT, else 60; 0 = no limit), or an asynchronous NCCL error, aborts the communicator and
// ends the job with one line naming the rank and the operation (MPI_Abort under mpirun, else _Exit).
// Tensors must be device memory (the cuda backend); all_reduce_sum and reduce_scatter_sum take f32 and
// f64. Uneven pieces (dew/comm.hpp counts) become grouped ncclReduce / ncclBroadcast calls, one per rank.
#include <cuda_runtime.h>
#include <nccl.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <dew/backend.hpp>
#include <dew/comm.hpp>
#include <dew/error.hpp>
#include <dew/registry.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>
#ifdef DEW_NCCL_WITH_MPI
#include <mpi.h>
#endif

namespace {

namespace fs = std::filesystem;

struct State {
  int rank = 0, size = 1, device = 0;
  bool mpi = false;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;
  void* one = nullptr;  // one float on the device, for barrier()
};
State g;

std::string who() { return "dew: rank " + std::to_string(g.rank) + " of " + std::to_string(g.size); }

[[noreturn]] void stop_job(int code, const std::string& message) {
  if (!message.empty()) {
    std::fprintf(stderr, "%s\n", message.c_str());
    std::fflush(stderr);
  }
  if (g.comm) ncclCommAbort(g.comm);
#ifdef DEW_NCCL_WITH_MPI
  if (g.mpi) {
    std::thread([code] {
      std::this_thread::sleep_for(std::chrono::seconds(10));
      std::_Exit(code);
    }).detach();
    MPI_Abort(MPI_COMM_WORLD, code);
  }
#endif
  std::_Exit(code);
}

void check_nccl(ncclResult_t rc, const char* op) {
  if (rc == ncclSuccess || rc == ncclInProgress) return;
  stop_job(1, who() + ": NCCL error in " + op + ": " + ncclGetErrorString(rc) + " (" +
                  (ncclGetLastError(g.comm) ? ncclGetLastError(g.comm) : "") + "); stopping");
}
void check_cuda(cudaError_t rc, const char* op) {
  if (rc == cudaSuccess) return;
  stop_job(1, who() + ": CUDA error in " + op + ": " + cudaGetErrorString(rc) + "; stopping");
}

int env_int(const char* name, int fallback) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  const long r = std::strtol(v, &end, 10);
  return (end && *end == '\0') ? int(r) : fallback;
}

int local_rank() {
  for (const char* var : {"LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"}) {
    const int r = env_int(var, -1);
    if (r >= 0) return r;
  }
  return 0;
}

#ifdef DEW_NCCL_WITH_MPI
bool launched_by_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  return initialized || std::getenv("OMPI_COMM_WORLD_SIZE") || std::getenv("PMI_SIZE") || std::getenv("PMIX_RANK");
}
void finalize_mpi() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}
#endif

// Rank 0 writes the id under `dir`; the others wait for it (up to `timeout` seconds, 0 = forever).
void file_rendezvous(ncclUniqueId& id, const std::string& dir, double timeout) {
  const fs::path file = fs::path(dir) / "dew-nccl-id";
  if (g.rank == 0) {
    std::error_code ec;
    fs::create_directories(dir, ec);
    const fs::path tmp = file.string() + ".tmp" + std::to_string(getpid());
    {
      std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
      DEW_USAGE_CHECK(f.good(), "nccl: cannot write the rendezvous file ", tmp.string(), " (DEW_NCCL_RENDEZVOUS)");
      f.write(id.internal, sizeof id.internal);
    }
    fs::rename(tmp, file, ec);
    DEW_USAGE_CHECK(!ec, "nccl: cannot publish the rendezvous file ", file.string(), ": ", ec.message());
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  for (;;) {
    std::ifstream f(file, std::ios::binary);
    if (f.good() && f.read(id.internal, sizeof id.internal) && f.gcount() == sizeof id.internal) return;
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    DEW_CHECK(timeout <= 0 || waited < timeout, "nccl: rank ", g.rank, " waited ", waited, " s for rank 0's id in ",
              file.string(), " (DEW_NCCL_RENDEZVOUS); is rank 0 running, and is the folder shared?");
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

void init(double timeout) {
  if (g.comm) return;
  ncclUniqueId id{};
#ifdef DEW_NCCL_WITH_MPI
  if (launched_by_mpi()) {
    int initialized = 0;
    MPI_Initialized(&initialized);
    if (!initialized) {
      int provided = 0;
      DEW_CHECK(MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided) == MPI_SUCCESS,
                "nccl: MPI_Init_thread failed");
      std::atexit(finalize_mpi);
    }
    g.mpi = true;
    MPI_Comm_rank(MPI_COMM_WORLD, &g.rank);
    MPI_Comm_size(MPI_COMM_WORLD, &g.size);
  }
#endif
  if (!g.mpi) {
    g.rank = env_int("RANK", 0);
    g.size = env_int("WORLD_SIZE", 1);
    DEW_USAGE_CHECK(g.size >= 1 && g.rank >= 0 && g.rank < g.size, "nccl: RANK=", g.rank, " WORLD_SIZE=", g.size,
                    " is not a rank of the job");
    DEW_USAGE_CHECK(g.size == 1 || std::getenv("DEW_NCCL_RENDEZVOUS"), "nccl: WORLD_SIZE=", g.size,
                    " without mpirun needs DEW_NCCL_RENDEZVOUS (a folder all ranks share) for the bootstrap");
  }
  int count = 0;
  const cudaError_t ce = cudaGetDeviceCount(&count);
  DEW_USAGE_CHECK(ce == cudaSuccess && count > 0, "nccl: no usable CUDA device (",
                  ce == cudaSuccess ? "none visible" : cudaGetErrorString(ce), "); use run.dist = mpi on CPUs");
  g.device = local_rank() % count;
  check_cuda(cudaSetDevice(g.device), "cudaSetDevice");
  if (g.rank == 0) check_nccl(ncclGetUniqueId(&id), "ncclGetUniqueId");
#ifdef DEW_NCCL_WITH_MPI
  if (g.mpi && g.size > 1) MPI_Bcast(id.internal, sizeof id.internal, MPI_BYTE, 0, MPI_COMM_WORLD);
#endif
  if (!g.mpi && g.size > 1) file_rendezvous(id, std::getenv("DEW_NCCL_RENDEZVOUS"), timeout);
  check_nccl(ncclCommInitRank(&g.comm, g.size, id, g.rank), "ncclCommInitRank");
  check_cuda(cudaStreamCreateWithFlags(&g.stream, cudaStreamNonBlocking), "cudaStreamCreate");
  check_cuda(cudaMalloc(&g.one, sizeof(float)), "cudaMalloc");
}

ncclDataType_t nccl_float_type(dew::DType t, const char* op) {
  switch (t) {
    case dew::DType::f32:
      return ncclFloat32;
    case dew::DType::f64:
      return ncclFloat64;
    default:
      break;
  }
  DEW_CHECK(false, "nccl: ", op, " supports f32 and f64 tensors, got ", dew::dtype_name(t));
  return ncclFloat32;
}

// The tensor's device pointer, checked to be memory of this communicator's device.
void* device_ptr(const dew::Tensor& t, const char* op) {
  DEW_CHECK(t.defined(), "nccl: ", op, " of an undefined tensor");
  DEW_CHECK(!t.backend().host_accessible(), "nccl: ", op, " of a tensor on the '", t.backend().name(),
            "' backend: nccl reduces GPU memory (use --backend cuda, or run.dist = mpi on CPUs)");
  void* p = t.data();
  cudaPointerAttributes a{};
  if (cudaPointerGetAttributes(&a, p) == cudaSuccess && a.type == cudaMemoryTypeDevice)
    DEW_CHECK(a.device == g.device, "nccl: ", op, ": the tensor is on device ", a.device,
              " but this rank's "
              "communicator uses device ",
              g.device, " (the local rank); set the cuda backend's device to match");
  return p;
}

// An enqueued collective: done when its event has fired.
class NcclRequest final : public dew::CommRequest {
 public:
  NcclRequest(dew::Tensor keep, const char* op, double timeout)
      : NcclRequest(std::vector<dew::Tensor>{std::move(keep)}, op, timeout) {}
  NcclRequest(std::vector<dew::Tensor> keep, const char* op, double timeout)
      : keep_(std::move(keep)), op_(op), timeout_(timeout) {
    check_cuda(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check_cuda(cudaEventRecord(done_, g.stream), "cudaEventRecord");
  }
  ~NcclRequest() override {
    if (done_) cudaEventDestroy(done_);
  }
  bool test() override {
    if (finished_) return true;
    const cudaError_t rc = cudaEventQuery(done_);
    if (rc == cudaErrorNotReady) return false;
    check_cuda(rc, op_);
    finished_ = true;
    return true;
  }
  void wait() override {
    const auto start = std::chrono::steady_clock::now();
    int polls = 0;
    while (!test()) {
      if (++polls > 1000) std::this_thread::sleep_for(std::chrono::microseconds(50));
      if ((polls & 255) == 0) {
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(g.comm, &async);
        check_nccl(async, op_);
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        if (timeout_ > 0 && waited > timeout_) {
          char t[32];
          std::snprintf(t, sizeof t, "%g", timeout_);
          stop_job(1, who() + ": " + op_ + " did not complete within " + t +
                          " s (a peer died, hangs or is far behind); stopping");
        }
      }
    }
  }

 private:
  std::vector<dew::Tensor> keep_;
  const char* op_;
  double timeout_;
  cudaEvent_t done_ = nullptr;
  bool finished_ = false;
};

class NcclCommunicator final : public dew::Communicator {
 public:
  explicit NcclCommunicator(const dew::Options& o) {
    timeout_ = dew::communicator_timeout(o, "nccl");
    init(timeout_);
  }

  std::string name() const override { return "nccl"; }
  int rank() const override { return g.rank; }
  int size() const override { return g.size; }
  double timeout() const override { return timeout_; }

  void all_reduce_sum(dew::Tensor& t) override { all_reduce_sum_async(t)->wait(); }

  std::shared_ptr<dew::CommRequest> all_reduce_sum_async(dew::Tensor& t) override {
    const ncclDataType_t type = nccl_float_type(t.dtype(), "all_reduce_sum");
    void* p = device_ptr(t, "all_reduce_sum");
    check_nccl(ncclAllReduce(p, p, size_t(t.numel()), type, ncclSum, g.comm, g.stream), "ncclAllReduce");
    return std::make_shared<NcclRequest>(t, "all_reduce_sum", timeout_);
  }

  void broadcast(dew::Tensor& t, int root) override { broadcast_async(t, root)->wait(); }

  std::shared_ptr<dew::CommRequest> broadcast_async(dew::Tensor& t, int root) override {
    DEW_CHECK(root >= 0 && root < g.size, "nccl: broadcast root ", root, " is not a rank of ", g.size);
    void* p = device_ptr(t, "broadcast");
    check_nccl(ncclBroadcast(p, p, t.nbytes(), ncclUint8, root, g.comm, g.stream), "ncclBroadcast");
    return std::make_shared<NcclRequest>(t, "broadcast", timeout_);
  }

  void all_gather(const dew::Tensor& in, dew::Tensor& out) override {
    DEW_CHECK(in.dtype() == out.dtype() && out.nbytes() == in.nbytes() * size_t(g.size),
              "nccl: all_gather needs out of ", g.size, " x the input's size and the same dtype");
    const void* src = device_ptr(in, "all_gather");
    void* dst = device_ptr(out, "all_gather");
    check_nccl(ncclAllGather(src, dst, in.nbytes(), ncclUint8, g.comm, g.stream), "ncclAllGather");
    NcclRequest(out, "all_gather", timeout_).wait();
  }

  // Equal pieces: ncclAllGather. Uneven ones: one ncclBroadcast per rank from its `in` into its place of
  // `out`, grouped (ncclGroupStart/End) so NCCL schedules them as one operation.
  std::shared_ptr<dew::CommRequest> all_gather_async(const dew::Tensor& in, dew::Tensor& out,
                                                    const std::vector<int64_t>& counts) override {
    DEW_CHECK(in.dtype() == out.dtype(), "nccl: all_gather needs the same dtype in and out");
    const std::vector<int64_t> c = dew::collective_counts(counts, out.numel(), g.size, "all_gather", "nccl");
    DEW_CHECK(in.numel() == c[size_t(g.rank)], "nccl: all_gather: rank ", g.rank, " contributes ", in.numel(),
              " elements, its count is ", c[size_t(g.rank)]);
    const size_t esize = dew::dtype_size(in.dtype());
    const void* src = in.numel() > 0 ? device_ptr(in, "all_gather") : nullptr;
    auto* dst = static_cast<unsigned char*>(out.numel() > 0 ? device_ptr(out, "all_gather") : nullptr);
    if (std::all_of(c.begin(), c.end(), [&](int64_t n) { return n == c.front(); })) {
      check_nccl(ncclAllGather(src, dst, size_t(c.front()) * esize, ncclUint8, g.comm, g.stream), "ncclAllGather");
    } else {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      size_t at = 0;
      for (int r = 0; r < g.size; ++r) {
        const size_t bytes = size_t(c[size_t(r)]) * esize;
        if (bytes > 0)
          check_nccl(ncclBroadcast(src, dst + at, bytes, ncclUint8, r, g.comm, g.stream), "ncclBroadcast (all_gather)");
        at += bytes;
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    }
    return std::make_shared<NcclRequest>(out, "all_gather", timeout_);
  }

  // Equal pieces: ncclReduceScatter. Uneven ones: one ncclReduce per rank onto that rank, grouped.
  std::shared_ptr<dew::CommRequest> reduce_scatter_sum_async(const dew::Tensor& in, dew::Tensor& out,
                                                            const std::vector<int64_t>& counts) override {
    const ncclDataType_t type = nccl_float_type(in.dtype(), "reduce_scatter_sum");
    DEW_CHECK(in.dtype() == out.dtype(), "nccl: reduce_scatter_sum needs the same dtype in and out");
    const std::vector<int64_t> c = dew::collective_counts(counts, in.numel(), g.size, "reduce_scatter_sum", "nccl");
    DEW_CHECK(out.numel() == c[size_t(g.rank)], "nccl: reduce_scatter_sum: rank ", g.rank, " receives ",
              c[size_t(g.rank)], " elements into a tensor of ", out.numel());
    const size_t esize = dew::dtype_size(in.dtype());
    const auto* src = static_cast<const unsigned char*>(in.numel() > 0 ? device_ptr(in, "reduce_scatter_sum") : nullptr);
    void* dst = out.numel() > 0 ? device_ptr(out, "reduce_scatter_sum") : nullptr;
    if (std::all_of(c.begin(), c.end(), [&](int64_t n) { return n == c.front(); })) {
      check_nccl(ncclReduceScatter(src, dst, size_t(c.front()), type, ncclSum, g.comm, g.stream), "ncclReduceScatter");
    } else {
      check_nccl(ncclGroupStart(), "ncclGroupStart");
      size_t at = 0;
      for (int r = 0; r < g.size; ++r) {
        const size_t n = size_t(c[size_t(r)]);
        if (n > 0)
          check_nccl(ncclReduce(src + at * esize, dst, n, type, ncclSum, r, g.comm, g.stream),
                     "ncclReduce (reduce_scatter_sum)");
        at += n;
      }
      check_nccl(ncclGroupEnd(), "ncclGroupEnd");
    }
    // `in` must outlive the collective too: keep both.
    return std::make_shared<NcclRequest>(std::vector<dew::Tensor>{in, out}, "reduce_scatter_sum", timeout_);
  }

  void barrier() override {
    check_nccl(ncclAllReduce(g.one, g.one, 1, ncclFloat32, ncclSum, g.comm, g.stream), "ncclAllReduce (barrier)");
    NcclRequest(dew::Tensor(), "barrier", timeout_).wait();
  }

  [[noreturn]] void abort(int code, const std::string& message) override { stop_job(code, message); }

 private:
  double timeout_ = 60.0;
};

}  // namespace

#define DEW_NCCL_NOTES \
  "NCCL " DEW_STR(NCCL_MAJOR) "." DEW_STR(NCCL_MINOR) "." DEW_STR(NCCL_PATCH) ", CUDA runtime " DEW_STR(CUDART_VERSION)
DEW_PLUGIN_WITH_NOTES("nccl", "0.1.0", DEW_NCCL_NOTES) {
  registrar.add<dew::Communicator>(
      {.name = "nccl",
       .description = "NCCL collectives on GPU memory (cuda backend): data-parallel training across GPUs, launched "
                      "with mpirun (or RANK/WORLD_SIZE + DEW_NCCL_RENDEZVOUS)",
       .factory = [](const dew::Options& o) { return std::make_shared<NcclCommunicator>(o); },
       .probe =
           [] {
             int count = 0;
             const cudaError_t e = cudaGetDeviceCount(&count);
             if (e != cudaSuccess)
               return dew::Support::no(std::string("no usable CUDA device: ") + cudaGetErrorString(e));
             if (count == 0) return dew::Support::no("no CUDA device");
             return dew::Support::yes();
           },
       .options = {{"timeout", "60",
                    "seconds a collective may take before the rank stops the job (0 = no limit; env "
                    "DEW_DIST_TIMEOUT)"}}});
}
