// tools/dew-run/serve.hpp — `dew-run serve`: an HTTP/JSON front (cpp-httplib) over dew::serve::Scheduler.
//
// Endpoints (docs/serving.md): POST /v1/completions (the OpenAI subset, `stream` as server-sent events)
// for a text run, POST /v1/images (alias /v1/images/generations: PNGs as base64 in OpenAI's
// {"data": [{"b64_json": ...}]}) for an image run (diffusion), GET /v1/models, GET /health. Request errors are JSON
// {"error": {message, type, param, code}}: 400 for malformed JSON, unknown fields, wrong types and out-of-range values;
// 404 for an unknown model or path; 429 when every slot and queue place is taken; 503 while draining. shutdown()
// (SIGTERM/SIGINT in `dew-run serve`) refuses new requests, lets the queued and running ones finish and be written,
// then stops the listener.
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dew/objective.hpp"
#include "dew/options.hpp"
#include "dew/serve.hpp"

namespace httplib {
class Server;
}

namespace dew_run {

struct ServeOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port
  dew::serve::SchedulerOptions scheduler;
  int64_t max_tokens = 4096;  // the most tokens one request may ask for
  int64_t max_n = 16;         // the most choices (`n`) one request may ask for
  int64_t max_images = 64;    // image runs: the most images one request may ask for
  int64_t max_steps = 1000;   // image runs: the most sampling steps one request may ask for
  std::string model_name;     // the id /v1/models reports (default: the run's name)
  bool access_log = false;    // one line per request on stderr
  // The chat template of POST /v1/chat/completions: a tokenizer_config.json, chat_template.jinja or a
  // folder holding one; "" (or a folder without one): dew's default template (dew/chat_template.hpp).
  std::string chat_template;
};

// What /v1/models reports besides the id.
struct ModelInfo {
  std::string id;
  int64_t step = 0, vocab_size = 0, context = 0;
  bool ema = false;
  std::string checkpoint, tokenizer;
  std::string kind = "text";                   // "text" | "images"
  std::map<std::string, std::string> details;  // image runs: the model's describe() (image_size, ...)
};

// The image side of the server (an objective whose generates_images() is true): one request at a time
// on the objective (the model is not thread-safe); waiting() counts the requests queued behind it. While
// run() loops, every request's generation runs on run()'s thread (the thread that loaded the model: one
// OpenMP pool in the process, see the cpu backend's cpu_backend.hpp); otherwise on the caller's.
class ImageService {
 public:
  explicit ImageService(std::shared_ptr<dew::Objective> objective) : objective_(std::move(objective)) {}
  // The images of one request (the keys of `dew-run sample` minus --out); UsageError for a bad request.
  std::vector<dew::GeneratedImage> generate(dew::Options& request, int64_t max_images);
  // Runs the requests' generations on the calling thread until stop() (from another thread) and every
  // request queued before it has run.
  void run();
  void stop();
  int64_t waiting() const { return waiting_; }
  int64_t served() const { return served_; }

 private:
  std::vector<dew::GeneratedImage> make(dew::Options& request, int64_t max_images);
  std::shared_ptr<dew::Objective> objective_;
  std::mutex mu_;                    // one generation at a time (inline, or run()'s jobs)
  std::mutex jobs_mu_;               // guards jobs_, looping_, stopping_
  std::condition_variable jobs_cv_;  // a job queued, or stop()
  std::deque<std::function<void()>> jobs_;
  bool looping_ = false, stopping_ = false;
  std::atomic<int64_t> waiting_{0}, served_{0};
};

class HttpServer {
 public:
  HttpServer(dew::serve::Scheduler& scheduler, ModelInfo info, const ServeOptions& options);
  HttpServer(ImageService& images, ModelInfo info, const ServeOptions& options);  // an image run
  ~HttpServer();
  // Binds options.host:options.port (0: a free port) and returns the port.
  int bind();
  // Serves until shutdown() (call bind() first). Returns false when the listener failed.
  bool listen();
  // Drains (new requests get 503; queued and running ones finish and are written) and stops listen().
  void shutdown();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// `dew-run serve`: loads the run (EMA weights unless use_ema is false), starts the scheduler and serves
// until SIGTERM or SIGINT, then drains. Returns the exit status.
int serve(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend,
          const ServeOptions& options);

}  // namespace dew_run
