// tools/dew-bench/serve.cpp — `dew-bench serve`: a closed-loop load generator for `dew-run serve`.
//
// For each concurrency level C in --clients, C client threads share --requests streamed completions
// (each client sends its next request when the previous one has ended). Every request has its own
// prompt (a window of --prompt-len bytes of a fixed text, after --shared-prefix bytes every prompt starts with: a
// system prompt) and seed, and asks for --max-tokens tokens.
// Per request: time to first token (TTFT: the first SSE chunk carrying text) and the total latency;
// per level: p50/p99 of both, generated tokens per second over the level's wall time (tokens from the
// final chunk's usage), and the server's mean decode batch and the prompt tokens it fed and found in its prefix
// cache (from /health before and after).
// One JSON line per level, like every dew-bench suite; it measures, it never asserts.
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "bench.hpp"

namespace dew_bench {

namespace {

using json = nlohmann::json;
using clock_type = std::chrono::steady_clock;

struct Sample {
  double ttft_ms = 0, latency_ms = 0;
  int64_t tokens = 0;
  bool ok = false;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const double at = p * double(v.size() - 1);
  const size_t lo = size_t(at);
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (v[hi] - v[lo]) * (at - double(lo));
}

const char* kText =
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it "
    "was the season of Darkness, it was the spring of hope, it was the winter of despair. ";

// The first `n` bytes of the system prompt every request starts with: the fixed text backwards, repeated.
std::string shared_prefix(int n) {
  const std::string text(kText);
  std::string out;
  while (int(out.size()) < n) out += std::string(text.rbegin(), text.rend());
  return out.substr(0, size_t(n));
}

Sample one_request(const std::string& host, int port, int index, const std::string& prefix, int prompt_len,
                   int max_tokens) {
  httplib::Client c(host, port);
  c.set_read_timeout(std::chrono::seconds(600));
  const std::string text = kText;
  const size_t start = size_t(index * 7) % (text.size() - size_t(prompt_len));
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = json{
      {"prompt", prefix + text.substr(start, size_t(prompt_len))},
      {"max_tokens", max_tokens},
      {"temperature", 0.8},
      {"seed", index},
      {"stream",
       true}}.dump();
  req.set_header("Content-Type", "application/json");
  Sample s;
  std::string buffer;
  const auto t0 = clock_type::now();
  req.content_receiver = [&](const char* d, size_t n, uint64_t, uint64_t) {
    buffer.append(d, n);
    size_t end;
    while ((end = buffer.find("\n\n")) != std::string::npos) {
      const std::string ev = buffer.substr(0, end);
      buffer.erase(0, end + 2);
      if (ev.rfind("data: ", 0) != 0 || ev == "data: [DONE]") continue;
      const json j = json::parse(ev.substr(6), nullptr, false);
      if (j.is_discarded()) continue;
      if (s.ttft_ms == 0)
        for (const json& ch : j.value("choices", json::array()))
          if (!ch.value("text", std::string()).empty())
            s.ttft_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
      if (j.contains("usage")) s.tokens = j["usage"].value("completion_tokens", int64_t(0));
    }
    return true;
  };
  auto res = c.send(req);
  s.latency_ms = std::chrono::duration<double, std::milli>(clock_type::now() - t0).count();
  s.ok = res && res->status == 200;
  return s;
}

json health(const std::string& host, int port) {
  httplib::Client c(host, port);
  auto r = c.Get("/health");
  return r && r->status == 200 ? json::parse(r->body, nullptr, false) : json();
}

}  // namespace

int run_serve(const std::vector<std::string>& args) {
  namespace po = boost::program_options;
  std::string url = "http://127.0.0.1:8000", clients_list = "1,4,16", config = "";
  int requests = 16, max_tokens = 64, prompt_len = 16, shared = 0;
  po::options_description d("dew-bench serve");
  d.add_options()("url", po::value(&url), "the server (dew-run serve)")(
      "clients", po::value(&clients_list), "concurrency levels, comma-separated")("requests", po::value(&requests),
                                                                                  "requests per level")(
      "max-tokens", po::value(&max_tokens), "tokens per request")("prompt-len", po::value(&prompt_len), "prompt bytes")(
      "shared-prefix", po::value(&shared), "bytes every prompt starts with before its own (a system prompt)")(
      "config", po::value(&config), "a label for the JSON lines (e.g. char-small)");
  po::variables_map vm;
  po::store(po::command_line_parser(args).options(d).positional({}).run(), vm);
  po::notify(vm);
  const std::string scheme = "http://";
  if (url.rfind(scheme, 0) == 0) url = url.substr(scheme.size());
  const size_t colon = url.rfind(':');
  const std::string host = url.substr(0, colon);
  const int port = colon == std::string::npos ? 80 : std::atoi(url.c_str() + colon + 1);
  if (health(host, port).is_null()) {
    std::cerr << "dew-bench serve: no server answers GET /health at " << host << ":" << port << "\n";
    return 1;
  }
  std::vector<int> levels;
  for (size_t at = 0; at < clients_list.size();) {
    const size_t comma = clients_list.find(',', at);
    levels.push_back(std::atoi(clients_list.substr(at, comma - at).c_str()));
    at = comma == std::string::npos ? clients_list.size() : comma + 1;
  }
  const std::string prefix = shared_prefix(shared);
  one_request(host, port, 0, prefix, prompt_len, 4);  // warm-up (and the prefix's first feed)
  int index = 1;
  for (int clients : levels) {
    const json before = health(host, port);
    std::vector<Sample> samples(static_cast<size_t>(requests));
    std::atomic<int> next{0};
    const auto t0 = clock_type::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&] {
        for (int i; (i = next++) < requests;)
          samples[size_t(i)] = one_request(host, port, index + i, prefix, prompt_len, max_tokens);
      });
    for (auto& t : threads) t.join();
    const double wall = std::chrono::duration<double>(clock_type::now() - t0).count();
    index += requests;
    const json after = health(host, port);
    std::vector<double> ttft, latency;
    int64_t tokens = 0, failed = 0;
    for (const Sample& s : samples) {
      if (!s.ok) {
        ++failed;
        continue;
      }
      ttft.push_back(s.ttft_ms);
      latency.push_back(s.latency_ms);
      tokens += s.tokens;
    }
    double batch = 0, prefilled = 0, cached = 0;
    if (!before.is_null() && !after.is_null()) {
      auto delta = [&](const char* key) { return after.value(key, 0.0) - before.value(key, 0.0); };
      const double iters = delta("iterations");
      batch = iters > 0 ? delta("decode_rows") / iters : 0;
      prefilled = delta("prefill_tokens");
      cached = delta("prefix_cached_tokens");
    }
    json line{{"bench", "serve"},
              {"config", config},
              {"clients", clients},
              {"requests", requests},
              {"failed", failed},
              {"prompt_len", prompt_len},
              {"shared_prefix", shared},
              {"max_tokens", max_tokens},
              {"ttft_ms_p50", percentile(ttft, 0.5)},
              {"ttft_ms_p99", percentile(ttft, 0.99)},
              {"latency_ms_p50", percentile(latency, 0.5)},
              {"latency_ms_p99", percentile(latency, 0.99)},
              {"tokens_per_sec", double(tokens) / wall},
              {"requests_per_sec", double(requests - failed) / wall},
              {"mean_decode_batch", batch},
              {"prefill_tokens", prefilled},
              {"prefix_cached_tokens", cached},
              {"seconds", wall}};
    std::cout << line.dump() << std::endl;
  }
  return 0;
}

}  // namespace dew_bench
