// tools/dew-run/serve.cpp — the HTTP front of `dew-run serve` (see serve.hpp and docs/serving.md).
//
// cpp-httplib's thread pool runs the handlers: each one parses and checks the JSON body, encodes the
// prompt and submits one scheduler request per choice (`n`), then waits on the tickets (non-streaming)
// or writes server-sent events as the tickets release final text (`stream`). The main thread, which loaded
// the model, alone runs it (Scheduler::run; image requests through ImageService::run). A streaming client that goes
// away cancels its requests (their slots free at the next iteration). Every response is counted in flight from routing
// until httplib has written it (the logger callback), so shutdown() can wait for the last byte before it stops the
// listener. An image run has no scheduler: POST /v1/images handlers queue their requests on the ImageService (one at a
// time, run on the main thread), and past `--queue` waiting requests the server answers 429.
#include "serve.hpp"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <filesystem>
#include <iostream>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <thread>

#include "chat_completions.hpp"
#include "dew/error.hpp"
#include "dew/objective.hpp"
#include "dew/tokenizer.hpp"
#include "dew/train.hpp"
#include "metrics.hpp"
#include "request_limits.hpp"
#include "route_bodies.hpp"

namespace dew_run {

namespace {

using json = nlohmann::json;
using dew::serve::Scheduler;
using dew::serve::Ticket;

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

// Listening-socket options: SO_REUSEADDR (a restart binds at once after TIME_WAIT) but not httplib's
// default SO_REUSEPORT, with which a second server on a busy port started and the two split the traffic.
void listen_socket_options(socket_t sock) {
  int yes = 1;
  ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

// Connection handling that stalled clients cannot exhaust: many spare workers beyond those a request
// can block (slots + queue), short read timeouts (a client that stops sending is dropped after
// kReadTimeoutSeconds), and a short keep-alive so idle connections give their worker back.
constexpr size_t kSpareWorkers = 256;
constexpr size_t kMaxBodyBytes = size_t(8) << 20;  // a request body (docs/serving.md)
constexpr int kReadTimeoutSeconds = 2;
constexpr int kKeepAliveSeconds = 2;

void harden_connections(httplib::Server& svr, size_t request_workers) {
  const size_t workers = request_workers + kSpareWorkers;
  svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
  svr.set_read_timeout(kReadTimeoutSeconds, 0);
  svr.set_keep_alive_timeout(kKeepAliveSeconds);
}

void send_error(httplib::Response& res, const HttpError& e) {
  json err{{"message", e.message}, {"type", e.type}, {"code", nullptr}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  res.status = e.status;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

// POST handlers take their body through a ContentReader: Debian's compiled cpp-httplib caps a body sent as
// application/x-www-form-urlencoded (curl -d's default) at 8,192 bytes before a plain handler sees it, which
// the payload limit does not lift. The reader applies the server's own limit (8 MiB: 413) and hands the
// handler a Request with the body in place.
using BodyHandler = std::function<void(const httplib::Request&, httplib::Response&)>;
httplib::Server::HandlerWithContentReader with_body(size_t max_bytes, BodyHandler handler) {
  return [max_bytes, handler = std::move(handler)](const httplib::Request& req, httplib::Response& res,
                                                   const httplib::ContentReader& reader) {
    httplib::Request full = req;
    const bool declared_too_large =
        std::strtoull(req.get_header_value("Content-Length").c_str(), nullptr, 10) > max_bytes;
    bool too_large = declared_too_large;
    const bool read = reader([&](const char* data, size_t length) {  // past the limit: read on, keep nothing
      too_large = too_large || full.body.size() + length > max_bytes;
      if (!too_large) full.body.append(data, length);
      return true;
    });
    if (!read && !too_large) {
      send_error(res, {400, "invalid_request_error", "the request body could not be read", ""});
      return;
    }
    if (too_large) {
      send_error(res, {413, "invalid_request_error",
                       "the request body is larger than " + std::to_string(max_bytes >> 20) + " MiB", ""});
      return;
    }
    handler(full, res);
  };
}

}  // namespace

struct HttpServer::Impl {
  Scheduler* sched = nullptr;      // a text run
  ImageService* images = nullptr;  // an image run
  ModelInfo info;
  ServeOptions options;
  httplib::Server svr;
  std::atomic<bool> draining{false};
  std::mutex mu;
  std::condition_variable cv;
  int64_t in_flight = 0;
  std::atomic<uint64_t> next_id{0};
  int listen_fd = -1;
  std::string id_prefix;
  ServeMetrics metrics;        // GET /metrics (metrics.hpp)
  chat::ChatSetup chat_setup;  // the template /v1/chat/completions renders with (chat_completions.hpp)
  std::string chat_error;      // why the run's template cannot be used, when it cannot

  Impl(Scheduler* s, ImageService* im, ModelInfo i, const ServeOptions& o)
      : sched(s), images(im), info(std::move(i)), options(o) {
    std::random_device rd;
    char buf[16];
    std::snprintf(buf, sizeof buf, "%08x", rd());
    id_prefix = buf;
    if (sched) {
      try {
        chat_setup = chat::setup_from_folder_or_file(options.chat_template);
      } catch (const dew::Error& e) {
        if (!options.chat_template.empty()) throw;  // asked for by name: refused at start, not per request
        chat_error = e.what();
      }
    }
    routes();
  }

  // What the route bodies are checked against (route_bodies.hpp).
  RouteLimits limits() const {
    return RouteLimits{info.id, info.vocab_size, options.max_tokens, options.max_n, options.max_steps, info.context};
  }

  void routes() {
    // Enough workers for every slot, every queue place and a few health probes: a handler blocks while
    // its request waits or runs.
    harden_connections(svr, size_t(options.scheduler.slots + options.scheduler.max_queue + 4));
    // Debian's libcpp-httplib is built with a listen backlog of 5: a burst of new connections past it
    // waits for a SYN retransmission (1 s). Keep the listening socket to widen its backlog after bind().
    svr.set_socket_options([this](socket_t sock) {
      listen_socket_options(sock);
      listen_fd = sock;
    });
    svr.set_keep_alive_max_count(1000);
    svr.set_payload_max_length(kMaxBodyBytes);
    svr.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
      metrics.count_response(req.path, res.status);
      if (options.access_log) std::fprintf(stderr, "%s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
    });
    svr.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
      if (!res.body.empty()) return;  // a handler's own error
      if (res.status == 404)
        send_error(res, {404, "invalid_request_error", "no route " + req.method + " " + req.path, ""});
      else if (res.status == 413)
        send_error(res, {413, "invalid_request_error", "the request body is too large", ""});
      else if (res.status >= 400)
        send_error(res, {res.status, "invalid_request_error",
                         "request refused (HTTP " + std::to_string(res.status) + ")", ""});
    });
    svr.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
      std::string what = "unknown error";
      try {
        std::rethrow_exception(ep);
      } catch (const std::exception& e) {
        what = e.what();
      } catch (...) {
      }
      send_error(res, {500, "server_error", what, ""});
    });
    svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
      if (!sched) {
        json j{{"status", draining ? "draining" : "ok"},
               {"kind", "images"},
               {"queued", images->waiting()},
               {"completed", images->served()}};
        res.status = draining ? 503 : 200;
        res.set_content(dump(j), "application/json");
        return;
      }
      const dew::serve::SchedulerStats s = sched->stats();
      json j{{"status", draining ? "draining" : "ok"},
             {"slots", s.slots},
             {"active", s.active},
             {"queued", s.queued},
             {"iterations", s.iterations},
             {"decode_rows", s.decode_rows},
             {"generated_tokens", s.generated_tokens},
             {"prefill_tokens", s.prefill_tokens},
             {"prefix_cached_tokens", s.prefix_cached},
             {"completed", s.completed}};
      res.status = draining ? 503 : 200;
      res.set_content(dump(j), "application/json");
    });
    svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
      res.set_content(prometheus_text(), "text/plain; version=0.0.4; charset=utf-8");
    });
    svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
      json m{{"id", info.id},
             {"object", "model"},
             {"created", 0},
             {"owned_by", "dew"},
             {"dew",
              {{"step", info.step},
               {"ema", info.ema},
               {"checkpoint", info.checkpoint},
               {"vocab_size", info.vocab_size},
               {"context_length", info.context},
               {"tokenizer", info.tokenizer},
               {"slots", options.scheduler.slots},
               {"kind", info.kind}}}};
      for (const auto& [k, v] : info.details) m["dew"][k] = v;
      res.set_content(dump(json{{"object", "list"}, {"data", json::array({m})}}), "application/json");
    });
    auto image_route = [this](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!images)
          throw HttpError{404, "invalid_request_error", "this server serves a text model: use POST /v1/completions",
                          ""};
        generate_images(req, res);
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const dew::Error& e) {  // the objective's checks of the request (labels, sampler, ...)
        send_error(
            res, e.kind() == dew::ErrorKind::usage ? bad(e.what()) : HttpError{500, "server_error", e.describe(), ""});
      } catch (const std::exception& e) {
        send_error(res, {500, "server_error", e.what(), ""});
      }
    };
    svr.Post("/v1/images", with_body(kMaxBodyBytes, image_route));
    svr.Post("/v1/images/generations", with_body(kMaxBodyBytes, image_route));
    svr.Post("/v1/chat/completions",
             with_body(kMaxBodyBytes, [this](const httplib::Request& req, httplib::Response& res) {
               try {
                 if (!sched)
                   throw HttpError{404, "invalid_request_error",
                                   "this server serves an image model: use POST /v1/images", ""};
                 completions(req, res, true);
               } catch (const HttpError& e) {
                 send_error(res, e);
               } catch (const dew::Error& e) {
                 send_error(res, e.kind() == dew::ErrorKind::usage ? bad(e.what())
                                                                   : HttpError{500, "server_error", e.describe(), ""});
               } catch (const std::exception& e) {
                 send_error(res, {500, "server_error", e.what(), ""});
               }
             }));
    svr.Post("/v1/completions", with_body(kMaxBodyBytes, [this](const httplib::Request& req, httplib::Response& res) {
               try {
                 if (!sched)
                   throw HttpError{404, "invalid_request_error",
                                   "this server serves an image model: use POST /v1/images", ""};
                 completions(req, res);
               } catch (const HttpError& e) {
                 send_error(res, e);
               } catch (const dew::Error& e) {  // the scheduler's own checks (e.g. a token outside the vocabulary)
                 send_error(res, e.kind() == dew::ErrorKind::usage ? bad(e.what())
                                                                   : HttpError{500, "server_error", e.describe(), ""});
               } catch (const std::exception& e) {
                 send_error(res, {500, "server_error", e.what(), ""});
               }
             }));
  }

  // GET /metrics: the scheduler's (or the image service's) counters and gauges, then the handlers' histograms and
  // response counts (metrics.hpp).
  std::string prometheus_text() const {
    std::string out;
    write_metric(out, "dew_draining", "gauge", "1 after SIGTERM while requests finish.", draining ? 1 : 0);
    if (sched) {
      const dew::serve::SchedulerStats s = sched->stats();
      write_metric(out, "dew_slots", "gauge", "Sequences decoded together (--slots).", double(s.slots));
      write_metric(out, "dew_requests_running", "gauge", "Requests in a slot.", double(s.active));
      write_metric(out, "dew_requests_waiting", "gauge", "Requests waiting for a slot.", double(s.queued));
      write_metric(out, "dew_requests_completed_total", "counter", "Requests (choices) ended, for any reason.",
                   double(s.completed));
      write_metric(out, "dew_iterations_total", "counter", "Scheduler iterations that ran the model.",
                   double(s.iterations));
      write_metric(out, "dew_decode_rows_total", "counter",
                   "Rows of the batched decode calls (over iterations: the mean batch).", double(s.decode_rows));
      write_metric(out, "dew_prefill_tokens_total", "counter", "Prompt tokens fed by prefill calls.",
                   double(s.prefill_tokens));
      write_metric(out, "dew_prefix_cached_tokens_total", "counter",
                   "Prompt tokens taken from the prefix cache instead of a feed.", double(s.prefix_cached));
      write_metric(out, "dew_prefill_shared_total", "counter",
                   "Prompts given an identical prompt's cache in the same iteration.", double(s.prefill_shared));
      write_metric(out, "dew_generated_tokens_total", "counter", "Tokens drawn.", double(s.generated_tokens));
    } else {
      write_metric(out, "dew_image_requests_waiting", "gauge", "Image requests waiting.", double(images->waiting()));
      write_metric(out, "dew_image_requests_completed_total", "counter", "Image requests served.",
                   double(images->served()));
    }
    metrics.time_to_first_token.write(out, "dew_time_to_first_token_seconds",
                                      "From a request's arrival to its first token, per choice.");
    metrics.request_latency.write(out, "dew_request_latency_seconds",
                                  "From a request's arrival to its end, per choice.");
    metrics.queue_time.write(out, "dew_request_queue_seconds", "From a request's arrival to its slot, per choice.");
    metrics.time_per_output_token.write(out, "dew_time_per_output_token_seconds",
                                        "A choice's time after its first token over its other tokens.");
    metrics.write_responses(out);
    return out;
  }

  // A choice that ended with tokens for its client: its latencies into the histograms.
  void observe(const Ticket& t, const dew::Generation& g) {
    using seconds = std::chrono::duration<double>;
    metrics.request_latency.observe(seconds(t.finished - t.submitted).count());
    if (t.admitted.time_since_epoch().count() != 0)
      metrics.queue_time.observe(seconds(t.admitted - t.submitted).count());
    if (t.first_token.time_since_epoch().count() != 0) {
      metrics.time_to_first_token.observe(seconds(t.first_token - t.submitted).count());
      if (g.tokens.size() > 1)
        metrics.time_per_output_token.observe(seconds(t.finished - t.first_token).count() /
                                              double(g.tokens.size() - 1));
    }
  }

  static json choice_json(int64_t index, const std::string& text, const json& finish, const json& logprobs = nullptr) {
    return json{{"index", index}, {"text", text}, {"logprobs", logprobs}, {"finish_reason", finish}};
  }

  // A completion choice's logprobs in OpenAI's completions shape: {"tokens", "token_logprobs", "top_logprobs" (per
  // token {text: logprob} of the likeliest and the drawn token), "text_offset"} (byte offsets into the choice's text:
  // `offset` on, advanced past these tokens). Tokens are named by chat::token_text. With `prompt`: the entries are its
  // tokens after the first, which comes first with null log-probabilities (nothing precedes it), as OpenAI's echo.
  static json completion_logprobs(const std::vector<dew::TokenLogprob>& entries, const dew::Tokenizer* tok,
                                  size_t& offset, const std::vector<int32_t>* prompt = nullptr) {
    json tokens = json::array(), logprobs = json::array(), tops = json::array(), offsets = json::array();
    if (prompt) {
      tokens.push_back(chat::token_text(tok, prompt->front()));
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      offsets.push_back(offset);
      offset += tok ? tok->token_bytes(prompt->front()).size() : 0;
    }
    for (const dew::TokenLogprob& e : entries) {
      const std::string t = chat::token_text(tok, e.token);
      tokens.push_back(t);
      logprobs.push_back(e.logprob);
      json top = json::object();
      for (const auto& [id, lp] : e.top) top.emplace(chat::token_text(tok, id), lp);  // one text, two ids: the likelier
      top.emplace(t, e.logprob);
      tops.push_back(top);
      offsets.push_back(offset);
      offset += tok ? tok->token_bytes(e.token).size() : 0;
    }
    return json{{"tokens", tokens}, {"token_logprobs", logprobs}, {"top_logprobs", tops}, {"text_offset", offsets}};
  }

  static json finish_json(const std::string& reason) {
    if (reason == "length") return "length";
    if (reason == "eos" || reason == "stop") return "stop";
    return reason;  // cancelled / error never reach a client that is still there
  }

  // A completion in flight, from its handler's start until httplib has written (or failed to write) its
  // response and destroyed the content provider holding this.
  struct Flight {
    explicit Flight(Impl& s) : self(s) {
      std::lock_guard<std::mutex> lk(self.mu);
      ++self.in_flight;
    }
    ~Flight() {
      {
        std::lock_guard<std::mutex> lk(self.mu);
        --self.in_flight;
      }
      self.cv.notify_all();
    }
    Impl& self;
  };

  // A /v1/chat/completions body as the /v1/completions body it renders to.
  std::string chat_body(const std::string& text) const {
    if (!chat_error.empty())
      throw HttpError{400, "invalid_request_error", "this run's chat template cannot be used: " + chat_error, ""};
    json body = parse_json_body(text);  // the request limits (request_limits.hpp) hold for chat bodies too
    try {
      return dump(chat::to_completion_body(body, chat_setup));
    } catch (const std::invalid_argument& e) {
      const std::string w = e.what();
      const size_t tab = w.find('\t');
      throw bad(w.substr(tab + 1), w.substr(0, tab));
    }
  }

  void completions(const httplib::Request& req, httplib::Response& res, bool chat = false) {
    auto flight = std::make_shared<Flight>(*this);
    if (draining) throw HttpError{503, "server_error", "the server is shutting down", ""};
    Completion c = parse_completion(chat ? chat_body(req.body) : req.body, limits(), sched->tokenizer(),
                                    chat ? DefaultLength::chat : DefaultLength::completion);
    std::vector<std::shared_ptr<Ticket>> tickets;
    for (int64_t i = 0; i < c.n; ++i) {
      dew::serve::Request r{c.prompt, c.params, uint64_t(i)};
      const Scheduler::Submitted s = sched->submit(std::move(r));
      if (s.status != Scheduler::Admission::accepted) {
        for (auto& t : tickets) t->cancel();
        if (s.status == Scheduler::Admission::draining)
          throw HttpError{503, "server_error", "the server is shutting down", ""};
        const auto st = sched->stats();
        res.set_header("Retry-After", "1");
        throw HttpError{429, "rate_limit_error",
                        "the server is full: " + std::to_string(st.slots) + " slots busy and " +
                            std::to_string(st.queued) + " requests waiting; retry later",
                        ""};
      }
      tickets.push_back(s.ticket);
    }
    const std::string id = (chat ? "chatcmpl-" : "cmpl-") + id_prefix + "-" + std::to_string(next_id++);
    const int64_t created = int64_t(std::time(nullptr));
    json base{{"id", id},
              {"object", chat ? (c.stream ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", info.id}};
    const std::string echo = c.echo ? c.prompt_text : std::string();
    const bool logprobs = c.params.logprobs >= 0;
    const dew::Tokenizer* tok = sched->tokenizer();
    if (!c.stream) {
      json choices = json::array();
      int64_t completion_tokens = 0;
      for (size_t i = 0; i < tickets.size(); ++i) {
        const dew::Generation g = tickets[i]->wait();
        if (g.finish_reason == "error" || g.finish_reason == "cancelled") {
          const std::string why = tickets[i]->error();
          throw HttpError{500, "server_error", "generation failed: " + (why.empty() ? g.finish_reason : why), ""};
        }
        observe(*tickets[i], g);
        completion_tokens += int64_t(g.tokens.size());
        size_t offset = echo.size();
        json lp = nullptr;
        if (logprobs && chat) {
          lp = chat::logprobs_json(g.logprobs, tok);
        } else if (logprobs && c.params.prompt_logprobs) {  // echo: the prompt's tokens first, the first one unscored
          offset = 0;
          lp = completion_logprobs(g.prompt_logprobs, tok, offset, &c.prompt);
          const json generated = completion_logprobs(g.logprobs, tok, offset);
          for (auto& [key, list] : lp.items())
            for (const json& e : generated[key]) list.push_back(e);
        } else if (logprobs) {
          lp = completion_logprobs(g.logprobs, tok, offset);
        }
        choices.push_back(chat ? chat::message_choice(int64_t(i), g.text, finish_json(g.finish_reason), lp)
                               : choice_json(int64_t(i), echo + g.text, finish_json(g.finish_reason), lp));
      }
      json body = base;
      body["choices"] = choices;
      body["seed"] = c.params.seed;
      const int64_t prompt_tokens = int64_t(c.prompt.size());
      body["usage"] = {{"prompt_tokens", prompt_tokens},
                       {"completion_tokens", completion_tokens},
                       {"total_tokens", prompt_tokens + completion_tokens}};
      auto text = std::make_shared<std::string>(dump(body));
      res.set_content_provider(
          text->size(), "application/json",
          [text, flight](size_t offset, size_t length, httplib::DataSink& sink) {
            return sink.write(text->data() + offset, length);
          },
          [](bool) {});
      return;
    }
    // Server-sent events: one `data: {chunk}` per piece of final text, a last chunk per choice with its
    // finish_reason, then `data: [DONE]`.
    auto state = std::make_shared<std::vector<bool>>(tickets.size(), false);  // choice finished
    auto echoed = std::make_shared<std::vector<bool>>(tickets.size(), echo.empty());
    auto started = std::make_shared<std::vector<bool>>(tickets.size(), false);  // chat: role sent
    auto offsets = std::make_shared<std::vector<size_t>>(tickets.size(), echo.size());  // completions' text_offset
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [this, tickets, state, echoed, started, offsets, chat, base, echo, flight, logprobs, tok,
         prompt_tokens = int64_t(c.prompt.size())](size_t, httplib::DataSink& sink) {
          auto event = [&](const json& chunk) {
            const std::string line = "data: " + dump(chunk) + "\n\n";
            return sink.write(line.data(), line.size());
          };
          const auto wait = std::chrono::milliseconds(tickets.size() == 1 ? 200 : 5);
          bool all_done = true;
          for (size_t i = 0; i < tickets.size(); ++i) {
            if ((*state)[i]) continue;
            if (!sink.is_writable()) return false;
            Ticket::Update u = tickets[i]->next(wait);
            if (!(*echoed)[i]) {
              u.text = echo + u.text;
              (*echoed)[i] = true;
            }
            if (!u.text.empty() || u.done || !u.logprobs.empty()) {
              json chunk = base;
              json finish = nullptr;
              if (u.done) {
                const dew::Generation g = tickets[i]->wait();
                finish = finish_json(g.finish_reason);
                (*state)[i] = true;
                if (g.finish_reason != "cancelled" && g.finish_reason != "error") observe(*tickets[i], g);
              }
              json lp = nullptr;  // the entries of the tokens whose text became final with this piece
              if (logprobs)
                lp = chat ? chat::logprobs_json(u.logprobs, tok) : completion_logprobs(u.logprobs, tok, (*offsets)[i]);
              chunk["choices"] = json::array({chat ? chat::delta_choice(int64_t(i), u.text, finish, !(*started)[i], lp)
                                                   : choice_json(int64_t(i), u.text, finish, lp)});
              (*started)[i] = true;
              if (!event(chunk)) return false;
            }
            all_done = all_done && (*state)[i];
          }
          if (all_done) {
            // Usage in a last chunk without choices (the shape of OpenAI's stream_options.include_usage).
            int64_t completion_tokens = 0;
            for (auto& t : tickets) completion_tokens += int64_t(t->wait().tokens.size());
            json usage = base;
            usage["choices"] = json::array();
            usage["usage"] = {{"prompt_tokens", prompt_tokens},
                              {"completion_tokens", completion_tokens},
                              {"total_tokens", prompt_tokens + completion_tokens}};
            if (!event(usage)) return false;
            const std::string done = "data: [DONE]\n\n";
            if (!sink.write(done.data(), done.size())) return false;
            sink.done();
          }
          return true;
        },
        [tickets](bool) {
          for (auto& t : tickets) t->cancel();  // a no-op for finished ones; frees slots of abandoned ones
        });
  }

  // POST /v1/images: {labels, n, steps, sampler, guidance, guidance_interval, guidance_rescale, seed,
  // sampler_options, response_format, model, user} -> the objective's request keys (dew-run sample's).
  void generate_images(const httplib::Request& req, httplib::Response& res) {
    auto flight = std::make_shared<Flight>(*this);
    if (draining) throw HttpError{503, "server_error", "the server is shutting down", ""};
    const ImageRequest ir = parse_image_request(req.body, limits());
    const std::map<std::string, std::string>& request = ir.keys;
    const uint64_t seed = ir.seed;
    if (images->waiting() >= options.scheduler.max_queue) {
      res.set_header("Retry-After", "1");
      throw HttpError{
          429, "rate_limit_error",
          "the server is full: " + std::to_string(images->waiting()) + " image requests waiting; retry later", ""};
    }
    dew::Options opts(request, "images");
    const std::vector<dew::GeneratedImage> made = images->generate(opts, options.max_images);
    json data = json::array();
    for (size_t i = 0; i < made.size(); ++i) {
      json d{{"index", i}, {"b64_json", base64(made[i].png)}};
      d["label"] = made[i].label >= 0 ? json(made[i].label) : json(nullptr);
      data.push_back(d);
    }
    json out{{"created", int64_t(std::time(nullptr))}, {"model", info.id}, {"seed", seed}, {"data", data}};
    auto text = std::make_shared<std::string>(dump(out));
    res.set_content_provider(
        text->size(), "application/json",
        [text, flight](size_t offset, size_t length, httplib::DataSink& sink) {
          return sink.write(text->data() + offset, length);
        },
        [](bool) {});
  }

  static std::string base64(const std::vector<unsigned char>& in) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    out.reserve((in.size() + 2) / 3 * 4);
    for (size_t i = 0; i < in.size(); i += 3) {
      const uint32_t b = uint32_t(in[i]) << 16 | (i + 1 < in.size() ? uint32_t(in[i + 1]) << 8 : 0u) |
                         (i + 2 < in.size() ? uint32_t(in[i + 2]) : 0u);
      out += a[(b >> 18) & 63];
      out += a[(b >> 12) & 63];
      out += i + 1 < in.size() ? a[(b >> 6) & 63] : '=';
      out += i + 2 < in.size() ? a[b & 63] : '=';
    }
    return out;
  }
};

HttpServer::HttpServer(Scheduler& scheduler, ModelInfo info, const ServeOptions& options)
    : impl_(std::make_unique<Impl>(&scheduler, nullptr, std::move(info), options)) {}

HttpServer::HttpServer(ImageService& images, ModelInfo info, const ServeOptions& options)
    : impl_(std::make_unique<Impl>(nullptr, &images, std::move(info), options)) {}

// One request's images on the calling thread (it no longer waits).
std::vector<dew::GeneratedImage> ImageService::make(dew::Options& request, int64_t max_images) {
  --waiting_;
  std::vector<dew::GeneratedImage> out = objective_->generate_images(request, max_images);
  ++served_;
  return out;
}

std::vector<dew::GeneratedImage> ImageService::generate(dew::Options& request, int64_t max_images) {
  ++waiting_;
  std::unique_lock<std::mutex> jobs_lk(jobs_mu_);
  if (looping_) {  // run() makes the images on its thread; this one waits for them
    std::packaged_task<std::vector<dew::GeneratedImage>()> task([&] { return make(request, max_images); });
    std::future<std::vector<dew::GeneratedImage>> done = task.get_future();
    jobs_.emplace_back([&task] { task(); });
    jobs_lk.unlock();
    jobs_cv_.notify_all();
    return done.get();  // rethrows the generation's error here
  }
  jobs_lk.unlock();
  std::lock_guard<std::mutex> lk(mu_);
  return make(request, max_images);
}

void ImageService::run() {
  std::unique_lock<std::mutex> lk(jobs_mu_);
  if (stopping_) return;
  looping_ = true;
  for (;;) {
    jobs_cv_.wait(lk, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) break;  // stopping, nothing left
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    lk.unlock();
    {
      std::lock_guard<std::mutex> model(mu_);  // after a generate() that began inline before run() did
      job();
    }
    lk.lock();
  }
  looping_ = false;
}

void ImageService::stop() {
  {
    std::lock_guard<std::mutex> lk(jobs_mu_);
    stopping_ = true;
  }
  jobs_cv_.notify_all();
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  int port = impl_->options.port;
  DEW_USAGE_CHECK(port >= 0 && port <= 65535, "serve: --port ", port, " is not a TCP port (0 to 65535; 0: any free one)");
  if (port == 0) {
    port = impl_->svr.bind_to_any_port(impl_->options.host);
  } else if (!impl_->svr.bind_to_port(impl_->options.host, port)) {
    port = -1;
  }
  DEW_USAGE_CHECK(port > 0, "serve: cannot listen on ", impl_->options.host, ":", impl_->options.port,
                  " (in use, or not a local address)");
  if (impl_->listen_fd >= 0) ::listen(impl_->listen_fd, SOMAXCONN);  // again: only the backlog changes
  return port;
}

bool HttpServer::listen() { return impl_->svr.listen_after_bind(); }

void HttpServer::shutdown() {
  impl_->draining = true;
  if (impl_->sched) impl_->sched->drain();  // every accepted request finishes (image requests: in_flight)
  {
    std::unique_lock<std::mutex> lk(impl_->mu);  // ... and its response is written
    impl_->cv.wait_for(lk, std::chrono::seconds(30), [&] { return impl_->in_flight == 0; });
  }
  impl_->svr.stop();
  if (impl_->images) impl_->images->stop();  // the model thread's loop returns (serve())
}

int serve(const std::string& run_dir, const std::string& step, bool use_ema, const std::string& backend,
          const ServeOptions& options) {
  // SIGTERM / SIGINT are taken by one thread (sigwait): blocked here, before any thread starts, so every
  // thread inherits the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  std::unique_ptr<dew::InferenceRun> run = dew::load_inference_run(run_dir, step, use_ema, backend);
  dew::Model* model = run->objective->main_model();
  auto* decoder = dynamic_cast<dew::CausalDecoder*>(model);
  const bool image_run = decoder == nullptr && run->objective->generates_images();
  DEW_USAGE_CHECK(decoder != nullptr || image_run, "serve: the run's model (objective '",
                  run->config.section("objective").get_string("plugin", ""),
                  "') generates neither text nor images: serving needs a causal decoder (lm objective) or an "
                  "image objective (diffusion)");
  if (model) model->set_training(false);
  std::shared_ptr<const dew::Tokenizer> tokenizer;
  std::unique_ptr<Scheduler> sched;
  std::unique_ptr<ImageService> image_service;

  ModelInfo info;
  info.id = options.model_name;
  if (info.id.empty()) info.id = run->config.section("run").get_string("name", "");
  if (info.id.empty()) info.id = std::filesystem::path(run_dir).lexically_normal().filename().string();
  info.step = run->updates;
  info.ema = run->ema;
  info.checkpoint = run->checkpoint;
  if (decoder) {
    tokenizer = run->objective->tokenizer();
    sched = std::make_unique<Scheduler>(*decoder, tokenizer, options.scheduler);
    info.vocab_size = decoder->vocab_size();
    info.context = sched->context();
    info.tokenizer = tokenizer ? tokenizer->name() : "";
  } else {
    image_service = std::make_unique<ImageService>(run->objective);
    info.kind = "images";
    if (model) info.details = model->describe();
  }

  // The chat template: --chat-template, else the run's ([data] template, tokenizer or path; chat_completions.hpp).
  ServeOptions opts = options;
  if (opts.chat_template.empty()) {
    const auto& data = run->config.section("data").values();
    for (const char* key : {"template", "tokenizer", "path"})
      if (auto it = data.find(key); it != data.end() && !it->second.empty()) {
        opts.chat_template = it->second;
        break;
      }
  }
  std::unique_ptr<HttpServer> server_ptr = sched ? std::make_unique<HttpServer>(*sched, info, opts)
                                                 : std::make_unique<HttpServer>(*image_service, info, opts);
  HttpServer& server = *server_ptr;
  const int port = server.bind();
  std::thread waiter([&] {
    int sig = 0;
    sigwait(&signals, &sig);
    std::fprintf(stderr, "dew-run serve: %s: finishing the requests in flight\n",
                 sig == SIGTERM ? "SIGTERM" : "SIGINT");
    std::thread second([&] {  // a second signal ends at once
      int again = 0;
      sigwait(&signals, &again);
      std::_Exit(130);
    });
    second.detach();
    server.shutdown();
  });
  if (sched)
    std::printf("dew-run serve: listening on http://%s:%d  (model '%s', step %lld%s, %lld slots, context %lld)\n",
                options.host.c_str(), port, info.id.c_str(), (long long)info.step, info.ema ? ", EMA weights" : "",
                (long long)options.scheduler.slots, (long long)info.context);
  else
    std::printf("dew-run serve: listening on http://%s:%d  (model '%s', step %lld%s, images: POST /v1/images)\n",
                options.host.c_str(), port, info.id.c_str(), (long long)info.step, info.ema ? ", EMA weights" : "");
  std::fflush(stdout);
  bool ok = true;
  std::thread listener([&] {
    ok = server.listen();
    if (!ok) kill(getpid(), SIGTERM);  // the listener failed on its own: the waiter drains and returns
  });
  // The model runs here, on the thread that loaded it, until shutdown() has drained: kernels from one thread
  // only, so the process keeps one OpenMP pool (two make libgomp sleep and wake its workers at every parallel
  // region: half the tokens a second on 2 cores; the cpu backend's cpu_backend.hpp).
  if (sched)
    sched->run();
  else
    image_service->run();
  listener.join();
  waiter.join();
  std::fprintf(stderr, "dew-run serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace dew_run
