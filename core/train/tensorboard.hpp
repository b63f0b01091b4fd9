// core/train/tensorboard.hpp — TensorBoard event files ([trainer] tensorboard = true): RUN_DIR/tb/.
//
// An event file is a sequence of TFRecords (u64 length, masked CRC32C of the length, the bytes, masked
// CRC32C of the bytes), each an `Event` protobuf: the first holds file_version "brain.Event:2", the others
// a `Summary` at a step (scalars as simple_value, images as PNG-encoded Summary.Image, text as the text
// plugin's DT_STRING tensor). Every write is flushed, so TensorBoard follows a live run.
//
// Invariants: one file per run directory (the newest events.out.tfevents.* in it, created when there is
// none); opening it at `start_step` keeps the records of steps <= start_step and cuts the rest (the events
// of updates after the checkpoint a resume starts from, and a record torn by a crash), like metrics.jsonl,
// then appends. Steps in the file therefore never go backwards.
#pragma once
#include <cstdint>
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

namespace dew::tensorboard {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), and TFRecord's mask of it.
uint32_t crc32c(const void* data, size_t size);
uint32_t masked_crc32c(const void* data, size_t size);

class EventWriter {
 public:
  // Opens (or creates) the event file in `dir`, rewound to `start_step` (see the top of this file).
  EventWriter(const std::string& dir, int64_t start_step);
  ~EventWriter();
  EventWriter(const EventWriter&) = delete;
  EventWriter& operator=(const EventWriter&) = delete;

  // One Event holding a scalar per (tag, value); values are stored as float32 (simple_value).
  void add_scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  // A PNG image (its size and channels read from the IHDR chunk). Refuses bytes that are not a PNG.
  void add_image(int64_t step, const std::string& tag, const std::vector<unsigned char>& png);
  // Text for TensorBoard's text plugin (rendered as Markdown).
  void add_text(int64_t step, const std::string& tag, const std::string& markdown);
  void flush();

  const std::string& path() const { return path_; }

 private:
  void write_record(const std::string& event_bytes);
  std::string path_;
  std::FILE* file_ = nullptr;
};

}  // namespace dew::tensorboard
