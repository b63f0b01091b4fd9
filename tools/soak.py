#!/usr/bin/env python3
# tools/soak.py — a bounded soak of `dew-run serve` on 127.0.0.1 (issue 20): N concurrent clients for a
# duration, each looping over a mix of valid, streaming, malformed, cancelled and stalled requests; reports
# p50/p99 latency of the valid ones, responses by status code, transport errors, and the server's resident
# memory at the start, after a warm-up (--warmup seconds: thread stacks and malloc arenas of the workers
# first touched) and at the end (from /proc/PID/status); growth is counted from the warm-up point.
# Standard library only.
#
#   tools/soak.py --port P --pid SERVER_PID [--clients 64] [--seconds 600] [--json out.json]
#
# Exit status 1 when the server died, answered 5xx other than 503/429, or /health stopped answering.
import argparse, http.client, json, os, random, socket, sys, threading, time

def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return -1

def request(port, method, path, body=None, timeout=30, stream=False):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    try:
        c.request(method, path, body=body, headers={"Content-Type": "application/json"} if body else {})
        r = c.getresponse()
        data = r.read()
        return r.status, data
    finally:
        c.close()

def stalled(port, hold):  # half a request, then silence: the server must drop it, not wait on it
    s = socket.create_connection(("127.0.0.1", port), timeout=hold + 5)
    try:
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"prompt\": ")
        time.sleep(hold)
    finally:
        s.close()

def cancelled(port):  # a streaming request closed after its first bytes
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    try:
        body = json.dumps({"prompt": "line 1", "max_tokens": 64, "stream": True}).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "
                  + str(len(body)).encode() + b"\r\n\r\n" + body)
        s.recv(64)
    finally:
        s.close()

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--pid", type=int, required=True)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=600)
    ap.add_argument("--max-tokens", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=30, help="seconds before the memory baseline")
    ap.add_argument("--json")
    a = ap.parse_args()
    assert 1 <= a.clients <= 512 and 0 < a.seconds <= 7200, "bounded: 1-512 clients, up to 2 hours"
    lock = threading.Lock()
    lat, codes, errors = [], {}, {}
    health_worst = [0.0]
    stop = time.time() + a.seconds
    valid = lambda: json.dumps({"prompt": "line %d" % random.randint(1, 300), "max_tokens": a.max_tokens})
    kinds = ["valid"] * 5 + ["stream", "malformed", "deep", "badtemp", "cancel", "stall"]

    def count(code):
        with lock:
            codes[code] = codes.get(code, 0) + 1

    def client(i):
        rnd = random.Random(i)
        while time.time() < stop:
            kind = rnd.choice(kinds)
            t0 = time.time()
            try:
                if kind == "valid":
                    code, _ = request(a.port, "POST", "/v1/completions", valid())
                    if code == 200:
                        with lock:
                            lat.append(time.time() - t0)
                elif kind == "stream":
                    code, _ = request(a.port, "POST", "/v1/completions",
                                      json.dumps({"prompt": "line 2", "max_tokens": a.max_tokens, "stream": True}))
                elif kind == "malformed":
                    code, _ = request(a.port, "POST", "/v1/completions", '{"prompt": [1, 2')
                elif kind == "deep":
                    code, _ = request(a.port, "POST", "/v1/completions", '{"prompt": ' + "[" * 100000 + "]" * 100000 + "}")
                elif kind == "badtemp":
                    code, _ = request(a.port, "POST", "/v1/completions", '{"prompt": "x", "temperature": 1e999}')
                elif kind == "cancel":
                    cancelled(a.port); code = "cancelled"
                else:
                    stalled(a.port, 3); code = "stalled"
                count(code)
            except Exception as e:
                with lock:
                    errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1

    def health():
        while time.time() < stop:
            t0 = time.time()
            try:
                code, _ = request(a.port, "GET", "/health", timeout=10)
                if code != 200:
                    count("health_%d" % code)
            except Exception as e:
                with lock:
                    errors["health_" + type(e).__name__] = errors.get("health_" + type(e).__name__, 0) + 1
            health_worst[0] = max(health_worst[0], time.time() - t0)
            time.sleep(0.5)

    rss_cold = rss_kib(a.pid)
    threads = [threading.Thread(target=client, args=(i,)) for i in range(a.clients)] + [threading.Thread(target=health)]
    for t in threads: t.start()
    time.sleep(min(a.warmup, a.seconds / 2))
    rss0 = rss_kib(a.pid)
    for t in threads: t.join()
    rss1 = rss_kib(a.pid)
    alive = os.path.exists(f"/proc/{a.pid}")
    lat.sort()
    q = lambda p: lat[min(len(lat) - 1, int(p * len(lat)))] * 1000 if lat else float("nan")
    out = {"clients": a.clients, "seconds": a.seconds, "valid_ok": len(lat), "p50_ms": q(0.50), "p99_ms": q(0.99),
           "codes": {str(k): v for k, v in sorted(codes.items(), key=lambda kv: str(kv[0]))}, "errors": errors,
           "health_worst_s": round(health_worst[0], 3), "rss_kib_start": rss_cold, "rss_kib_after_warmup": rss0,
           "rss_kib_end": rss1,
           "rss_growth_pct": round(100.0 * (rss1 - rss0) / rss0, 2) if rss0 > 0 else None, "server_alive": alive}
    print(json.dumps(out, indent=1))
    if a.json:
        with open(a.json, "w") as f: json.dump(out, f, indent=1)
    bad5xx = [k for k in codes if isinstance(k, int) and k >= 500 and k not in (503,)]
    ok = alive and not bad5xx and health_worst[0] < 5 and len(lat) > 0
    sys.exit(0 if ok else 1)

if __name__ == "__main__":
    main()
