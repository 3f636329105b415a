#!/usr/bin/env python3
"""Shared-prefix chat load against a gateway: Poisson arrivals, streamed answers, TTFT per request.

usage: load.py GATEWAY_URL MODEL RATE DURATION_S OUT.json [SEED]  (run by run.sh)
16 system prompts (~6,000 characters each), a unique ~200-character question per request,
max_tokens 32, stream with usage. Prints TTFT P50/P95/P99, cached tokens and per-pod counts.
"""
import http.client, json, random, sys, threading, time, urllib.parse

url, model, rate, duration, out = sys.argv[1], sys.argv[2], float(sys.argv[3]), float(sys.argv[4]), sys.argv[5]
seed = int(sys.argv[6]) if len(sys.argv) > 6 else 1
rng = random.Random(seed)
words = ["report", "quarter", "revenue", "table", "margin", "region", "forecast", "growth", "cost",
         "customer", "segment", "churn", "pricing", "contract", "renewal", "pipeline", "risk", "audit"]
def text(r, n):
    s = []
    while sum(len(w) + 1 for w in s) < n:
        s.append(r.choice(words))
    return " ".join(s)
groups = [f"You are assistant {g}. " + text(random.Random(1000 + g), 6000) for g in range(16)]
u = urllib.parse.urlparse(url)
results, lock = [], threading.Lock()

def one(i, group, question, explain):
    body = json.dumps({"model": model, "max_tokens": 32, "stream": True,
                       "stream_options": {"include_usage": True},
                       "messages": [{"role": "system", "content": groups[group]},
                                    {"role": "user", "content": question}]})
    t0 = time.monotonic()
    rec = {"i": i, "group": group}
    try:
        c = http.client.HTTPConnection(u.hostname, u.port, timeout=120)
        h = {"content-type": "application/json"}
        if explain:
            h["x-infergate-explain"] = "1"
        c.request("POST", "/v1/chat/completions", body, h)
        r = c.getresponse()
        rec["status"] = r.status
        rec["pod"] = r.getheader("x-infergate-pod")
        rec["explain"] = r.getheader("x-infergate-explain")
        ttft = None
        for line in r:
            line = line.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            d = json.loads(line[5:])
            if ttft is None and d.get("choices") and d["choices"][0].get("delta", {}).get("content"):
                ttft = time.monotonic() - t0
            if d.get("usage"):
                rec["prompt_tokens"] = d["usage"]["prompt_tokens"]
                rec["cached_tokens"] = (d["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0)
        rec["ttft"] = ttft
        rec["e2e"] = time.monotonic() - t0
        c.close()
    except Exception as e:  # a failed request is reported, not fatal
        rec["error"] = repr(e)
    with lock:
        results.append(rec)

threads, t, i = [], 0.0, 0
start = time.monotonic()
while t < duration:
    t += rng.expovariate(rate)
    group, question = rng.randrange(16), f"Question {i}: " + text(rng, 200)
    delay = start + t - time.monotonic()
    if delay > 0:
        time.sleep(delay)
    th = threading.Thread(target=one, args=(i, group, question, i % 50 == 0))
    th.start()
    threads.append(th)
    i += 1
for th in threads:
    th.join()
json.dump(results, open(out, "w"), indent=1)
ok = [r for r in results if r.get("status") == 200 and r.get("ttft") is not None]
tt = sorted(r["ttft"] for r in ok)
q = lambda p: tt[min(len(tt) - 1, int(p * len(tt)))] * 1000 if tt else float("nan")
pods = {}
for r in ok:
    pods[r["pod"]] = pods.get(r["pod"], 0) + 1
cached = sum(r.get("cached_tokens", 0) for r in ok)
prompt = sum(r.get("prompt_tokens", 0) for r in ok)
print(f"requests {len(results)} ok {len(ok)}  TTFT ms P50 {q(.5):.0f} P95 {q(.95):.0f} P99 {q(.99):.0f} mean {1000*sum(tt)/max(1,len(tt)):.0f}")
print(f"cached tokens {cached} of {prompt} prompt tokens ({100*cached/max(1,prompt):.1f}%)")
print("per pod", dict(sorted(pods.items())))
for r in reversed(results):
    if r.get("explain"):
        print("explain:", r["explain"][:400])
        break
