// tools/dew-run/serve.cpp — the HTTP front of `dew-run serve` (see serve.hpp and docs/serving.md).
//
// cpp-httplib's thread pool runs the handlers: each one parses and checks the JSON body, encodes the
// prompt and submits one scheduler request per choice (`n`), then waits on the tickets (non-streaming)
// or writes server-sent events as the tickets release final text (`stream`). The scheduler thread alone
// runs the model. A streaming client that goes away cancels its requests (their slots free at the next
// iteration). Every response is counted in flight from routing until httplib has written it (the
// logger callback), so shutdown() can wait for the last byte before it stops the listener.
// An image run has no scheduler: POST /v1/images handlers take turns on the ImageService (one request
// at a time), and past `--queue` waiting requests the server answers 429.
#include "serve.hpp"

#include <httplib.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
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

namespace dew_run {

namespace {

using json = nlohmann::json;
using dew::serve::Scheduler;
using dew::serve::Ticket;

// A request error: HTTP status, OpenAI-style error type, message and the offending field.
struct HttpError {
  int status;
  std::string type, message, param;
};

HttpError bad(const std::string& message, const std::string& param = "") {
  return {400, "invalid_request_error", message, param};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

void send_error(httplib::Response& res, const HttpError& e) {
  json err{{"message", e.message}, {"type", e.type}, {"code", nullptr}};
  err["param"] = e.param.empty() ? json(nullptr) : json(e.param);
  res.status = e.status;
  res.set_content(dump(json{{"error", err}}), "application/json");
}

// The fields of POST /v1/completions (OpenAI's, plus top_k, min_p, repetition_penalty, ignore_eos).
const std::set<std::string> kCompletionFields = {
    "model", "prompt", "max_tokens", "temperature",        "top_p",      "top_k", "min_p", "seed",
    "stop",  "stream", "echo",       "repetition_penalty", "ignore_eos", "n",     "user"};

std::string field_list() {
  std::string s;
  for (const std::string& f : kCompletionFields) s += (s.empty() ? "" : ", ") + f;
  return s;
}

double number(const json& body, const char* key, double def, double lo, double hi, bool lo_open = false) {
  if (!body.contains(key)) return def;
  const json& v = body.at(key);
  if (!v.is_number()) throw bad(std::string("'") + key + "' must be a number", key);
  const double x = v.get<double>();
  const bool below = lo_open ? !(x > lo) : !(x >= lo);
  if (below || !(x <= hi) || !std::isfinite(x)) {
    char range[96];
    std::snprintf(range, sizeof range, "%s%g, %g]", lo_open ? "(" : "[", lo, hi);
    throw bad(std::string("'") + key + "' must be in " + range + ", got " + v.dump(), key);
  }
  return x;
}

int64_t integer(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  if (!body.contains(key)) return def;
  const json& v = body.at(key);
  if (!v.is_number_integer()) throw bad(std::string("'") + key + "' must be an integer", key);
  if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(std::numeric_limits<int64_t>::max()))
    throw bad(std::string("'") + key + "' is too large", key);
  const int64_t x = v.get<int64_t>();
  if (x < lo || x > hi)
    throw bad(std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " +
                  std::to_string(x),
              key);
  return x;
}

bool boolean(const json& body, const char* key, bool def) {
  if (!body.contains(key)) return def;
  if (!body.at(key).is_boolean()) throw bad(std::string("'") + key + "' must be true or false", key);
  return body.at(key).get<bool>();
}

// A checked completion request.
struct Completion {
  std::vector<int32_t> prompt;
  std::string prompt_text;  // for echo
  dew::SamplingParams params;
  int64_t n = 1;
  bool stream = false, echo = false;
};

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
        chat_error = e.what();
      }
    }
    routes();
  }

  void routes() {
    // Enough workers for every slot, every queue place and a few health probes: a handler blocks while
    // its request waits or runs.
    const size_t workers = size_t(options.scheduler.slots + options.scheduler.max_queue + 4);
    svr.new_task_queue = [workers] { return new httplib::ThreadPool(workers); };
    // Debian's libcpp-httplib is built with a listen backlog of 5: a burst of new connections past it
    // waits for a SYN retransmission (1 s). Keep the listening socket to widen its backlog after bind().
    svr.set_socket_options([this](socket_t sock) {
      httplib::default_socket_options(sock);
      listen_fd = sock;
    });
    svr.set_keep_alive_max_count(1000);
    svr.set_payload_max_length(size_t(8) << 20);
    if (options.access_log)
      svr.set_logger([](const httplib::Request& req, const httplib::Response& res) {
        std::fprintf(stderr, "%s %s %d\n", req.method.c_str(), req.path.c_str(), res.status);
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
             {"completed", s.completed}};
      res.status = draining ? 503 : 200;
      res.set_content(dump(j), "application/json");
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
    svr.Post("/v1/images", image_route);
    svr.Post("/v1/images/generations", image_route);
    svr.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!sched)
          throw HttpError{404, "invalid_request_error", "this server serves an image model: use POST /v1/images", ""};
        completions(req, res, true);
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const dew::Error& e) {
        send_error(
            res, e.kind() == dew::ErrorKind::usage ? bad(e.what()) : HttpError{500, "server_error", e.describe(), ""});
      } catch (const std::exception& e) {
        send_error(res, {500, "server_error", e.what(), ""});
      }
    });
    svr.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      try {
        if (!sched)
          throw HttpError{404, "invalid_request_error", "this server serves an image model: use POST /v1/images", ""};
        completions(req, res);
      } catch (const HttpError& e) {
        send_error(res, e);
      } catch (const dew::Error& e) {  // the scheduler's own checks (e.g. a token outside the vocabulary)
        send_error(
            res, e.kind() == dew::ErrorKind::usage ? bad(e.what()) : HttpError{500, "server_error", e.describe(), ""});
      } catch (const std::exception& e) {
        send_error(res, {500, "server_error", e.what(), ""});
      }
    });
  }

  Completion parse(const std::string& text) const {
    json body;
    try {
      body = json::parse(text);
    } catch (const json::parse_error& e) {
      throw bad(std::string("malformed JSON: ") + e.what());
    }
    if (!body.is_object()) throw bad("the request body must be a JSON object");
    for (auto it = body.begin(); it != body.end(); ++it)
      if (!kCompletionFields.count(it.key()))
        throw bad("unknown field '" + it.key() + "' (known: " + field_list() + ")", it.key());
    if (body.contains("model") && (!body["model"].is_string() || body["model"].get<std::string>() != info.id))
      throw HttpError{404, "invalid_request_error",
                      "model " + body["model"].dump() + " is not served here (this server serves '" + info.id + "')",
                      "model"};
    if (body.contains("user") && !body["user"].is_string()) throw bad("'user' must be a string", "user");
    Completion c;
    const dew::Tokenizer* tok = sched->tokenizer();
    if (!body.contains("prompt")) throw bad("'prompt' is required", "prompt");
    json prompt = body["prompt"];
    if (prompt.is_array() && prompt.size() == 1 && prompt[0].is_string()) prompt = prompt[0];
    if (prompt.is_string()) {
      if (!tok) throw bad("this model has no tokenizer: send 'prompt' as an array of token ids", "prompt");
      c.prompt_text = prompt.get<std::string>();
      c.prompt = tok->encode(c.prompt_text);
      if (c.prompt.empty()) {
        if (tok->eos_id() < 0)
          throw bad("'prompt' is empty and the tokenizer has no end-of-text token to start from", "prompt");
        c.prompt.push_back(tok->eos_id());
      }
    } else if (prompt.is_array() && !prompt.empty()) {
      for (const json& t : prompt) {
        if (!t.is_number_integer()) throw bad("'prompt' must be a string or an array of token ids", "prompt");
        const int64_t id = t.get<int64_t>();
        if (id < 0 || id >= info.vocab_size)
          throw bad("prompt token " + std::to_string(id) + " is outside the vocabulary [0, " +
                        std::to_string(info.vocab_size) + ")",
                    "prompt");
        c.prompt.push_back(int32_t(id));
      }
      if (tok) c.prompt_text = tok->decode(c.prompt);
    } else {
      throw bad("'prompt' must be a string or a non-empty array of token ids", "prompt");
    }
    dew::SamplingParams& sp = c.params;
    sp.max_new_tokens = integer(body, "max_tokens", 16, 0, options.max_tokens);
    sp.temperature = float(number(body, "temperature", 1.0, 0.0, 1e6));
    sp.top_p = float(number(body, "top_p", 1.0, 0.0, 1.0, true));
    sp.top_k = integer(body, "top_k", 0, -1, std::numeric_limits<int32_t>::max());
    if (sp.top_k < 0) sp.top_k = 0;  // -1: off, as vLLM spells it
    sp.min_p = float(number(body, "min_p", 0.0, 0.0, 1.0));
    sp.repetition_penalty = float(number(body, "repetition_penalty", 1.0, 0.0, 1e6, true));
    if (body.contains("seed")) {
      sp.seed = uint64_t(integer(body, "seed", 0, 0, std::numeric_limits<int64_t>::max()));
    } else {  // drawn: at most 2^53 - 1, so a JSON client (JavaScript numbers) replays it exactly
      std::random_device rd;
      sp.seed = ((uint64_t(rd()) << 32) ^ rd()) & ((uint64_t(1) << 53) - 1);
    }
    if (body.contains("stop")) {
      const json& st = body["stop"];
      std::vector<std::string> stops;
      if (st.is_string()) {
        stops.push_back(st.get<std::string>());
      } else if (st.is_array()) {
        for (const json& s : st) {
          if (!s.is_string()) throw bad("'stop' must be a string or an array of strings", "stop");
          stops.push_back(s.get<std::string>());
        }
      } else if (!st.is_null()) {
        throw bad("'stop' must be a string or an array of strings", "stop");
      }
      if (stops.size() > 16) throw bad("'stop' holds at most 16 strings", "stop");
      for (const std::string& s : stops)
        if (s.empty()) throw bad("a 'stop' string is empty", "stop");
      if (!stops.empty() && !tok) throw bad("stop strings need a tokenizer; this model has none", "stop");
      sp.stop = stops;
    }
    c.stream = boolean(body, "stream", false);
    c.echo = boolean(body, "echo", false);
    sp.eos_id = boolean(body, "ignore_eos", false) || !tok ? -1 : tok->eos_id();
    c.n = integer(body, "n", 1, 1, options.max_n);
    return c;
  }

  static json choice_json(int64_t index, const std::string& text, const json& finish) {
    return json{{"index", index}, {"text", text}, {"logprobs", nullptr}, {"finish_reason", finish}};
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
    json body;
    try {
      body = json::parse(text);
    } catch (const json::parse_error& e) {
      throw bad(std::string("malformed JSON: ") + e.what());
    }
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
    Completion c = parse(chat ? chat_body(req.body) : req.body);
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
    if (!c.stream) {
      json choices = json::array();
      int64_t completion_tokens = 0;
      for (size_t i = 0; i < tickets.size(); ++i) {
        const dew::Generation g = tickets[i]->wait();
        if (g.finish_reason == "error" || g.finish_reason == "cancelled") {
          const std::string why = tickets[i]->error();
          throw HttpError{500, "server_error", "generation failed: " + (why.empty() ? g.finish_reason : why), ""};
        }
        completion_tokens += int64_t(g.tokens.size());
        choices.push_back(chat ? chat::message_choice(int64_t(i), g.text, finish_json(g.finish_reason))
                               : choice_json(int64_t(i), echo + g.text, finish_json(g.finish_reason)));
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
    res.set_header("Cache-Control", "no-cache");
    res.set_chunked_content_provider(
        "text/event-stream",
        [tickets, state, echoed, started, chat, base, echo, flight, prompt_tokens = int64_t(c.prompt.size())](
            size_t, httplib::DataSink& sink) {
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
            if (!u.text.empty() || u.done) {
              json chunk = base;
              json finish = nullptr;
              if (u.done) {
                const dew::Generation g = tickets[i]->wait();
                finish = finish_json(g.finish_reason);
                (*state)[i] = true;
              }
              chunk["choices"] = json::array({chat ? chat::delta_choice(int64_t(i), u.text, finish, !(*started)[i])
                                                   : choice_json(int64_t(i), u.text, finish)});
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
    json body;
    try {
      body = json::parse(req.body);
    } catch (const json::parse_error& e) {
      throw bad(std::string("malformed JSON: ") + e.what());
    }
    if (!body.is_object()) throw bad("the request body must be a JSON object");
    static const std::set<std::string> fields = {"model",
                                                 "labels",
                                                 "n",
                                                 "steps",
                                                 "sampler",
                                                 "guidance",
                                                 "seed",
                                                 "guidance_interval",
                                                 "guidance_rescale",
                                                 "sampler_options",
                                                 "response_format",
                                                 "user"};
    for (auto it = body.begin(); it != body.end(); ++it)
      if (!fields.count(it.key())) {
        std::string known;
        for (const std::string& f : fields) known += (known.empty() ? "" : ", ") + f;
        throw bad("unknown field '" + it.key() + "' (known: " + known + ")", it.key());
      }
    if (body.contains("model") && (!body["model"].is_string() || body["model"].get<std::string>() != info.id))
      throw HttpError{404, "invalid_request_error",
                      "model " + body["model"].dump() + " is not served here (this server serves '" + info.id + "')",
                      "model"};
    if (body.contains("user") && !body["user"].is_string()) throw bad("'user' must be a string", "user");
    if (body.contains("response_format") &&
        (!body["response_format"].is_string() || body["response_format"].get<std::string>() != "b64_json"))
      throw bad("'response_format' must be \"b64_json\" (no URLs are served)", "response_format");
    std::map<std::string, std::string> request;
    if (body.contains("labels")) {
      const json& l = body["labels"];
      if (!l.is_array() || l.empty()) throw bad("'labels' must be a non-empty array of class ids", "labels");
      std::string list;
      for (const json& v : l) {
        if (!v.is_number_integer()) throw bad("'labels' must be a non-empty array of class ids", "labels");
        list += (list.empty() ? "" : ",") + std::to_string(v.get<int64_t>());
      }
      request["labels"] = list;
    }
    request["n"] = std::to_string(integer(body, "n", 1, 1, options.max_n));
    if (body.contains("steps")) request["steps"] = std::to_string(integer(body, "steps", 0, 1, options.max_steps));
    if (body.contains("sampler")) {
      if (!body["sampler"].is_string()) throw bad("'sampler' must be a string", "sampler");
      request["sampler"] = body["sampler"].get<std::string>();
    }
    auto num = [](double x) {
      char b[32];
      std::snprintf(b, sizeof b, "%.17g", x);
      return std::string(b);
    };
    if (body.contains("guidance")) request["guidance"] = num(number(body, "guidance", 1.0, 0.0, 1e3));
    if (body.contains("guidance_rescale"))
      request["guidance_rescale"] = num(number(body, "guidance_rescale", 0.0, 0.0, 1.0));
    if (body.contains("guidance_interval")) {
      const json& g = body["guidance_interval"];
      if (!g.is_array() || g.size() != 2 || !g[0].is_number() || !g[1].is_number())
        throw bad("'guidance_interval' must be [start, stop] in [0, 1]", "guidance_interval");
      request["guidance_interval"] = num(g[0].get<double>()) + "," + num(g[1].get<double>());
    }
    uint64_t seed = 0;
    if (body.contains("seed")) {
      seed = uint64_t(integer(body, "seed", 0, 0, (int64_t(1) << 40)));
    } else {
      std::random_device rd;
      seed = ((uint64_t(rd()) << 32) ^ rd()) & ((uint64_t(1) << 40) - 1);
    }
    request["seed"] = std::to_string(seed);
    if (body.contains("sampler_options")) {  // the solver's own keys: {"eta": 0.5, "s_churn": 10}
      const json& so = body["sampler_options"];
      if (!so.is_object()) throw bad("'sampler_options' must be an object of solver keys", "sampler_options");
      for (auto it = so.begin(); it != so.end(); ++it) {
        if (fields.count(it.key()) || it.key() == "out" || it.key() == "batch")
          throw bad("'sampler_options' may not set '" + it.key() + "'", "sampler_options");
        const json& v = it.value();
        if (v.is_number())
          request[it.key()] = num(v.get<double>());
        else if (v.is_string())
          request[it.key()] = v.get<std::string>();
        else if (v.is_boolean())
          request[it.key()] = v.get<bool>() ? "true" : "false";
        else
          throw bad("'sampler_options." + it.key() + "' must be a number, string or boolean", "sampler_options");
      }
    }
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

std::vector<dew::GeneratedImage> ImageService::generate(dew::Options& request, int64_t max_images) {
  ++waiting_;
  std::unique_lock<std::mutex> lk(mu_);
  --waiting_;
  std::vector<dew::GeneratedImage> out = objective_->generate_images(request, max_images);
  ++served_;
  return out;
}

HttpServer::~HttpServer() = default;

int HttpServer::bind() {
  int port = impl_->options.port;
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
  if (sched) sched->start();
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
  const bool ok = server.listen();
  if (!waiter.joinable()) return ok ? 0 : 1;
  if (!ok) {  // the listener failed on its own: wake the waiter so it drains and returns
    kill(getpid(), SIGTERM);
  }
  waiter.join();
  std::fprintf(stderr, "dew-run serve: stopped\n");
  return ok ? 0 : 1;
}

}  // namespace dew_run
