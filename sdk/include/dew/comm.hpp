// dew/comm.hpp — the Communicator interface (plugin kind "communicator"): collectives between the
// processes of a data-parallel job. The core knows only this interface; `mpi` (plugins/comms/mpi) is
// the CPU implementation, `nccl` comes with the GPU work.
//
// Contract:
//  * rank() in [0, size()); every process of the job calls the collectives in the same order with
//    tensors of the same shape and dtype (a collective is matched by its position in that sequence).
//  * Tensors live on any backend: a communicator works on host memory directly and stages other
//    memory through the host (or, for a device-aware one, hands device pointers to its library).
//  * all_reduce_sum: floating dtypes (f32, f64; bf16/f16 are refused for now), in place, the same
//    result on every rank. The summation order is the library's: results are deterministic for a given
//    world size, not identical across world sizes.
//  * broadcast / all_gather move raw bytes: any dtype.
//  * reduce_scatter_sum / all_gather with `counts` (the sharded data parallel of docs/distributed.md):
//    `counts` has size() entries, in elements, the same on every rank; rank r's piece is counts[r]
//    elements at offset counts[0] + ... + counts[r-1] of the full tensor. Pieces may be uneven or empty
//    (a parameter owned by one rank is a piece of its whole size and zeros elsewhere). Empty `counts`
//    means equal pieces (the full size divisible by size()). Shapes do not matter, element counts do.
//  * Failure: a peer that died or stopped answering must not hang the job. Waiting on a collective for
//    longer than the communicator's timeout (its option `timeout`, seconds; counted from the start of
//    the wait, not the launch) ends the process, and asks the launcher to end the others, with one
//    line on stderr naming the rank, the operation and the timeout. Library errors do the same.
//    Nothing throws past a failed collective: the job is gone.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "dew/options.hpp"
#include "dew/tensor.hpp"

namespace dew {

// A pending non-blocking collective.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // Advances the operation without blocking (libraries without a progress thread only progress
  // inside calls); true once it has completed.
  virtual bool test() = 0;
  // Blocks until the operation has completed; the tensor it was given then holds the result. Waiting
  // longer than the communicator's timeout stops the process (see above).
  virtual void wait() = 0;
};

class Communicator {
 public:
  static constexpr const char* kind = "communicator";
  virtual ~Communicator() = default;

  virtual std::string name() const = 0;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // The seconds a collective may take before the process stops (0 = no limit).
  virtual double timeout() const = 0;

  // t = sum over ranks of t (in place).
  virtual void all_reduce_sum(Tensor& t) = 0;
  // The same, non-blocking: t must stay alive and untouched until the request's wait() returns.
  virtual std::shared_ptr<CommRequest> all_reduce_sum_async(Tensor& t) = 0;
  // t on every rank = t on `root` (same shape and dtype everywhere).
  virtual void broadcast(Tensor& t, int root) = 0;
  // The same, non-blocking: t must stay alive and untouched until the request's wait() returns.
  virtual std::shared_ptr<CommRequest> broadcast_async(Tensor& t, int root) = 0;
  // out [size() * n, ...] = the `in` of every rank ([n, ...]) concatenated in rank order.
  virtual void all_gather(const Tensor& in, Tensor& out) = 0;
  // out [sum(counts)] = the `in` of every rank (rank r: counts[r] elements) concatenated in rank order;
  // non-blocking: in and out stay alive and untouched until wait() returns. Any dtype.
  virtual std::shared_ptr<CommRequest> all_gather_async(const Tensor& in, Tensor& out,
                                                        const std::vector<int64_t>& counts) = 0;
  // out (counts[rank()] elements) = the sum over ranks of piece rank() of `in` (sum(counts) elements);
  // non-blocking, like all_gather_async. Floating dtypes as all_reduce_sum; `in` is left unchanged.
  virtual std::shared_ptr<CommRequest> reduce_scatter_sum_async(const Tensor& in, Tensor& out,
                                                                const std::vector<int64_t>& counts) = 0;
  void reduce_scatter_sum(const Tensor& in, Tensor& out, const std::vector<int64_t>& counts = {}) {
    reduce_scatter_sum_async(in, out, counts)->wait();
  }
  virtual void barrier() = 0;
  // Ends every process of the job with exit status `code` after printing `message` (when not empty).
  [[noreturn]] virtual void abort(int code, const std::string& message) = 0;
};

// A communicator's collective timeout in seconds (0 = no limit): option 'timeout', else the
// DEW_DIST_TIMEOUT environment variable, else 60. Bad values are usage errors naming `plugin`.
double communicator_timeout(const Options& options, const std::string& plugin);

// The pieces of a reduce-scatter / all-gather over `world` ranks of a tensor of `total` elements: `counts`
// when given (checked: `world` non-negative entries summing to `total`), else equal pieces (checked:
// `total` divisible by `world`). `op` and `plugin` name the call in errors.
std::vector<int64_t> collective_counts(const std::vector<int64_t>& counts, int64_t total, int world,
                                       const char* op, const std::string& plugin);

}  // namespace dew
