#!/usr/bin/env python3
"""tests/serve/metrics_check.py URL — dew-run serve's GET /metrics read by Prometheus's own Python client parser
(prometheus_client.parser, Debian's python3-prometheus-client), after openai_client.cjs has driven the server:
the exposition parses; the families have their types; every histogram's buckets are cumulative, its +Inf bucket its
count, and it observed the requests made; the counters equal /health's figures; responses are counted by route and
status (the client's 400s and 200s)."""
import json
import sys
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

url = sys.argv[1]
with urllib.request.urlopen(url + "/metrics") as r:
    content_type = r.headers["Content-Type"]
    text = r.read().decode()
with urllib.request.urlopen(url + "/health") as r:
    health = json.load(r)
assert content_type.startswith("text/plain; version=0.0.4"), content_type

families = {f.name: f for f in text_string_to_metric_families(text)}
def value(name):
    samples = families[name].samples
    assert len(samples) == 1, (name, samples)
    return samples[0].value

types = {"dew_requests_running": "gauge", "dew_requests_waiting": "gauge", "dew_slots": "gauge",
         "dew_generated_tokens": "counter", "dew_prefill_tokens": "counter", "dew_prefix_cached_tokens": "counter",
         "dew_requests_completed": "counter", "dew_iterations": "counter", "dew_http_responses": "counter",
         "dew_time_to_first_token_seconds": "histogram", "dew_request_latency_seconds": "histogram",
         "dew_request_queue_seconds": "histogram", "dew_time_per_output_token_seconds": "histogram"}
for name, kind in types.items():
    assert name in families, f"{name} missing from /metrics"
    assert families[name].type == kind, (name, families[name].type)

for key, field in [("dew_generated_tokens", "generated_tokens"), ("dew_prefill_tokens", "prefill_tokens"),
                   ("dew_prefix_cached_tokens", "prefix_cached_tokens"), ("dew_requests_completed", "completed"),
                   ("dew_iterations", "iterations"), ("dew_decode_rows", "decode_rows"),
                   ("dew_requests_running", "active"), ("dew_requests_waiting", "queued"), ("dew_slots", "slots")]:
    assert value(key) == health[field], (key, value(key), field, health[field])
assert value("dew_generated_tokens") > 0

def histogram(name):
    buckets, total, count = [], None, None
    for s in families[name].samples:
        if s.name.endswith("_bucket"):
            buckets.append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            total = s.value
        elif s.name.endswith("_count"):
            count = s.value
    bounds = [b for b, _ in buckets]
    assert bounds == sorted(bounds) and bounds[-1] == float("inf"), (name, bounds)
    counts = [c for _, c in buckets]
    assert all(a <= b for a, b in zip(counts, counts[1:])), (name, counts)  # cumulative
    assert counts[-1] == count, (name, counts[-1], count)
    assert total >= 0, (name, total)
    return count, total

latency_count, latency_sum = histogram("dew_request_latency_seconds")
ttft_count, ttft_sum = histogram("dew_time_to_first_token_seconds")
queue_count, queue_sum = histogram("dew_request_queue_seconds")
histogram("dew_time_per_output_token_seconds")
# Every choice the client got back was observed: at least the client's requests, at most the scheduler's completed.
assert 10 <= latency_count <= value("dew_requests_completed"), (latency_count, value("dew_requests_completed"))
assert ttft_count <= latency_count and queue_count == latency_count, (ttft_count, queue_count, latency_count)
assert ttft_sum <= latency_sum and queue_sum <= latency_sum, (ttft_sum, queue_sum, latency_sum)

responses = {(s.labels["route"], s.labels["code"]): s.value for s in families["dew_http_responses"].samples}
assert responses.get(("/v1/chat/completions", "200"), 0) >= 5, responses
assert responses.get(("/v1/chat/completions", "400"), 0) >= 4, responses  # the client's typed-error checks
assert responses.get(("/v1/completions", "200"), 0) >= 4, responses
print(f"metrics_check: {len(families)} families parsed by prometheus_client; {int(latency_count)} requests observed,"
      f" counters = /health, histograms cumulative: ok")
