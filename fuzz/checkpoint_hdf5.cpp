// fuzz/checkpoint_hdf5.cpp — libFuzzer target: whole HDF5 checkpoints as `--resume`, eval, sample and serve
// read them (core/checkpoint/checkpoint.cpp with libhdf5), seeded with real checkpoints (a current one with
// its checksum block, and a legacy one without: the path where damaged bytes reach libhdf5, read first in a
// forked child). Any bytes must be accepted or refused with one dew::Error: verify_checkpoint and
// read_checkpoint (tensors on the ref backend) never crash, and agree — a file verify_checkpoint calls intact
// is read, one it refuses is refused.
#include "clang14_compat.hpp"  // first: dew/registry.hpp under clang-14

#include <cstdint>
#include <string>

#include "dew/backend.hpp"
#include "dew/checkpoint.hpp"
#include "dew/error.hpp"
#include "dew/registry.hpp"
#include "scratch.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const dew::BackendPtr ref = [] {
    dew::Registry::global().discover(dew::Registry::default_plugin_dirs(), {"ref"});
    return dew::create_backend("ref");
  }();
  static const std::string path = (fuzz::scratch_dir("checkpoint") / "input.h5").string();
  fuzz::put_file(path, {reinterpret_cast<const char*>(data), size});
  std::string problem;
  try {
    problem = dew::verify_checkpoint(path);
  } catch (const dew::Error& e) {
    problem = e.what();
  }
  bool read = false;
  try {
    const dew::CheckpointData c = dew::read_checkpoint(path, ref);
    read = true;
  } catch (const dew::Error&) {
  }
  if (read != problem.empty()) __builtin_trap();
  return 0;
}
