"""The real-vLLM end-to-end suite: vLLM CPU instances serving a tiny random-weight model (A and B
for most checks, C and D publishing KV events for check 9), infergate's gateway, BBR and picker in
front, and the checks below.

Run by run.sh, which prepares the venvs and the infergate binary and passes:
  --bin INFERGATE --work DIR --reports DIR --perf-python PY
REAL_VLLM_CHECKS=1,2,... runs a subset (setup always runs). Each check prints its numbers; the
suite exits 1 if any check failed.
"""
import argparse
import concurrent.futures as cf
import json
import os
import random
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
import traceback

import httpx

# Polls a port until it refuses a connection (or a deadline passes) and prints the wall-clock
# time it first refused: `python3 -c WATCH_PORT HOST PORT DEADLINE`.
WATCH_PORT = """
import socket, sys, time
host, port, until = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
while time.time() < until:
    try:
        socket.create_connection((host, port), timeout=0.5).close()
    except ConnectionRefusedError:
        print(time.time(), flush=True)
        break
    except OSError:
        pass
    time.sleep(0.002)
"""

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import (LOCAL, CheckFailed, KvEventTap, Procs, expect, fmt_ms,  # noqa: E402
                     free_port, http_ok, log, lora_state, metric, parse_families, parse_samples,
                     pct, scrape, wait_until)

HERE = os.path.dirname(os.path.abspath(__file__))
MODEL = "tiny"
# The gateway of the routing and fault checks runs on the product's scrape defaults (interval
# 50 ms, staleAfterMs 250, timeoutMs 250, maxLateMs 20000; the preset's maxMetricsAgeMs 2000).
# vLLM's API server answers /metrics on the Python event loop that also streams tokens, so on
# two busy cores a page can take seconds: the scraper reports such a pod late (alive, slow)
# and the scheduler keeps routing on its last page, while a refused or broken connection fails
# the pod at once (docs/metrics.md, "Freshness").
SCRAPE_INTERVAL_MS = 50
STALE_AFTER_MS = 250


class Suite:
    def __init__(self, args):
        self.a = args
        self.work = args.work
        self.reports = args.reports
        os.makedirs(self.work, exist_ok=True)
        os.makedirs(self.reports, exist_ok=True)
        self.procs = Procs(os.path.join(self.work, "logs"), os.path.join(self.work, "pids"))
        self.vllm_ports = {"A": free_port(), "B": free_port()}
        while self.vllm_ports["B"] == self.vllm_ports["A"]:
            self.vllm_ports["B"] = free_port()
        # Check 9's two instances, C and D, publish their KV events (a publisher and a replay
        # socket each). vLLM binds only a wildcard endpoint (it connects to any other), so these
        # listen on every interface. A and B run without: with KV events on, check 3's gateway
        # never saw lora-a running on A's page (cause not found).
        self.kv_ports = {}
        taken = set(self.vllm_ports.values())
        for inst in ("C", "D"):
            p = free_port()
            while p in taken:
                p = free_port()
            taken.add(p)
            self.vllm_ports[inst] = p
        for inst in ("C", "D"):
            pair = []
            while len(pair) < 2:
                p = free_port()
                if p not in taken:
                    taken.add(p)
                    pair.append(p)
            self.kv_ports[inst] = tuple(pair)
        self.gw_port = None
        self.gw_admin = None
        self.timings = {}
        self.results = {}
        self.http = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0))

    # ------------------------------------------------------------------ addresses
    def addr(self, inst):
        return f"{LOCAL}:{self.vllm_ports[inst]}"

    def url(self, inst, path):
        return f"http://{self.addr(inst)}{path}"

    def inst_of(self, endpoint):
        for k in self.vllm_ports:
            if endpoint == self.addr(k):
                return k
        return endpoint

    def gw(self, path):
        return f"http://{LOCAL}:{self.gw_port}{path}"

    def decision_view(self, explained, inst):
        """(waiting, KV use, running) of `inst` as one routing decision saw it
        (`x-infergate-explain`: `waiting=` and `running=` are the page's queue and batch plus this
        gateway's requests since, the `kv-cache` score is one minus the KV use); a pod the
        saturation filter removed counts as (inf, 1.0, inf); None when the decision did not
        consider it."""
        addr = self.addr(inst)
        parts = explained.split(" | ")
        if f"{addr}:saturation" in parts[0].split("filtered=")[-1]:
            return float("inf"), 1.0, float("inf")
        for part in parts[1:]:
            fields = part.split()
            if len(fields) < 2 or fields[1] != addr:
                continue
            kv = {k: v for k, _, v in (f.partition("=") for f in fields[2:])}
            try:
                return (float(kv["waiting"]), 1.0 - float(kv["kv-cache"].split("*")[0]),
                        float(kv["running"]))
            except (KeyError, ValueError):
                return None
        return None

    def gw_metrics(self):
        return scrape(f"http://{LOCAL}:{self.gw_admin}/metrics")

    def gw_pod(self, text, name, inst, **match):
        """A per-pod gauge (infergate_pod_*) of the gateway's page for instance `inst`."""
        return metric(text, name, pod=self.addr(inst), **match)

    def gw_scrape_state(self, text, inst):
        """ok / late / failed, as the gateway's infergate_pod_scrape_state shows it."""
        for state in ("ok", "late", "failed"):
            if self.gw_pod(text, "infergate_pod_scrape_state", inst, state=state) == 1:
                return state
        return "?"

    # ------------------------------------------------------------------ setup
    def make_model(self):
        out = os.path.join(self.work, "tiny")
        shutil.rmtree(out, ignore_errors=True)
        r = subprocess.run([sys.executable, os.path.join(HERE, "make_model.py"), out],
                           capture_output=True, text=True, timeout=300)
        if r.returncode != 0:
            raise CheckFailed(f"make_model.py failed:\n{r.stdout[-2000:]}\n{r.stderr[-4000:]}")
        info = json.loads(r.stdout.strip().splitlines()[-1])
        self.model_dir = info["model"]
        self.adapters = {"lora-a": info["adapters"][0], "lora-b": info["adapters"][1]}
        log(f"tiny model: vocab {info['vocab_size']}, hidden 128, 2 layers, 4 heads; adapters "
            f"{', '.join(self.adapters)}")

    def vllm_argv(self, inst):
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                "--host", LOCAL, "--port", str(self.vllm_ports[inst]),
                "--model", self.model_dir, "--served-model-name", MODEL,
                "--load-format", "dummy", "--max-model-len", "2048",
                "--distributed-executor-backend", "uni", "--num-gpu-blocks-override", "64",
                "--enable-lora", "--max-loras", "2", "--max-lora-rank", "8",
                "--lora-modules", *(f"{n}={p}" for n, p in self.adapters.items()),
                "--enable-prefix-caching", "--seed", "0"] + ([] if inst not in self.kv_ports else [
                "--kv-events-config", json.dumps({
                    "enable_kv_cache_events": True, "publisher": "zmq",
                    "endpoint": f"tcp://*:{self.kv_ports[inst][0]}",
                    "replay_endpoint": f"tcp://*:{self.kv_ports[inst][1]}"})])

    def vllm_env(self, inst):
        env = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
        if inst == "B":
            env["VLLM_CPU_OMP_THREADS_BIND"] = "1"
        return env

    def start_vllm(self, inst):
        self.procs.start(f"vllm-{inst}", self.vllm_argv(inst), env=self.vllm_env(inst),
                         cwd=self.work)

    def repick_ports(self, inst):
        """New free ports for an instance whose port another process took meanwhile (ports are
        picked when the suite starts; by check 9, minutes later, a client's ephemeral port or
        another vLLM's internal socket may hold one)."""
        taken = set(self.vllm_ports.values()) | {p for pair in self.kv_ports.values() for p in pair}
        fresh = []
        while len(fresh) < (3 if inst in self.kv_ports else 1):
            p = free_port()
            if p not in taken:
                taken.add(p)
                fresh.append(p)
        self.vllm_ports[inst] = fresh[0]
        if inst in self.kv_ports:
            self.kv_ports[inst] = (fresh[1], fresh[2])

    def start_fresh(self, insts, attempts=3):
        """Starts instances nothing else points at yet and waits until each is healthy; one
        that exits because its address is taken is started again on new ports. Returns each
        instance's seconds to healthy (its last start)."""
        for inst in insts:
            self.start_vllm(inst)
        took = {}
        for inst in insts:
            for attempt in range(1, attempts + 1):
                try:
                    took[inst] = self.wait_vllm(inst)
                    break
                except CheckFailed:
                    # The whole log of this start: vLLM's own traceback of the engine core that
                    # could not bind (a ZMQError for a KV-events socket) comes well before the
                    # API server's, past the tail the failure quotes.
                    taken = "Address already in use" in self.procs.tail(f"vllm-{inst}", 100_000)
                    if not taken or attempt == attempts:
                        raise
                    old = self.addr(inst)
                    self.procs.stop(f"vllm-{inst}")
                    self.repick_ports(inst)
                    log(f"vLLM {inst}: {old} was taken by another process; starting it again on "
                        f"{self.addr(inst)}")
                    self.start_vllm(inst)
        return took

    def wait_vllm(self, inst, timeout=240):
        t0 = time.monotonic()

        def up():
            if not self.procs.alive(f"vllm-{inst}"):
                raise CheckFailed(f"vLLM {inst} exited:\n{self.procs.tail(f'vllm-{inst}', 40)}")
            return http_ok(self.url(inst, "/health"))

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if up():
                return time.monotonic() - t0
            time.sleep(0.5)
        raise CheckFailed(f"vLLM {inst} not healthy after {timeout}s:\n"
                          f"{self.procs.tail(f'vllm-{inst}', 40)}")

    def gateway_config(self, endpoints, interval_ms=None, stale_ms=None, timeout_ms=None,
                       port=None, admin=None):
        eps = "\n".join(f"      - {e}" for e in endpoints)
        # No scrape section: the product defaults (check 6 sets its own intervals).
        scrape = "" if interval_ms is None else (
            f"scrape:\n  intervalMs: {interval_ms}\n  staleAfterMs: {stale_ms}\n"
            f"  timeoutMs: {timeout_ms}\n")
        return f"""# written by tests/e2e/real-vllm/suite.py
listen: {LOCAL}:{port}
admin: {LOCAL}:{admin}
reloadIntervalMs: 0
auth: none
explainHeader: true
limits:
  maxRequestBodyBytes: 65536
timeouts:
  connectMs: 1000
  firstByteMs: 60000
retries:
  maxAttempts: 2
{scrape}models:
  - name: {MODEL}
    engine: vllm
    loraAdapters: [lora-a, lora-b]
    scheduler:
      preset: infergate
    endpoints:
{eps}
"""

    def start_gateway(self, name="gateway", endpoints=None, **kw):
        port, admin = free_port(), free_port()
        cfg = self.gateway_config(endpoints or [self.addr("A"), self.addr("B")], port=port,
                                  admin=admin, **kw)
        path = os.path.join(self.work, f"{name}.yaml")
        with open(path, "w") as f:
            f.write(cfg)
        # REAL_VLLM_GATEWAY_LOG=info,infergate_pool=debug logs every routing decision.
        self.procs.start(name, [self.a.bin, "gateway", "--config", path, "--workers", "1"],
                         env={"RUST_LOG": os.environ.get("REAL_VLLM_GATEWAY_LOG", "info")})
        wait_until(lambda: http_ok(f"http://{LOCAL}:{admin}/healthz"), 30, 0.2,
                   f"{name} /healthz")
        return port, admin

    def start_main_gateway(self):
        self.gw_port, self.gw_admin = self.start_gateway()
        wait_until(lambda: http_ok(f"http://{LOCAL}:{self.gw_admin}/readyz"), 30, 0.2,
                   "gateway /readyz (both instances scraped)")

    def setup(self):
        t0 = time.monotonic()
        self.make_model()
        self.timings["model"] = time.monotonic() - t0
        t1 = time.monotonic()
        for inst, dt in self.start_fresh(("A", "B")).items():
            log(f"vLLM {inst} on {self.addr(inst)} healthy after {dt:.1f}s "
                f"(rss {self.rss_mib(f'vllm-{inst}')} MiB)")
        self.timings["vllm start"] = time.monotonic() - t1
        self.start_main_gateway()
        log(f"gateway on {LOCAL}:{self.gw_port}, admin {LOCAL}:{self.gw_admin}")

    def rss_mib(self, name):
        p = self.procs.procs.get(name)
        if p is None:
            return 0
        total = 0
        try:
            out = subprocess.run(["ps", "-eo", "pgid=,rss="], capture_output=True, text=True,
                                 timeout=5).stdout
            total = sum(int(r) for g, r in (l.split() for l in out.splitlines() if l.strip())
                        if int(g) == p.pid)
        except Exception:  # noqa: BLE001
            pass
        return total // 1024

    # ------------------------------------------------------------------ request helpers
    def completion_body(self, model=MODEL, prompt="hello world", max_tokens=8, stream=False,
                        **extra):
        b = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "ignore_eos": True,
             "stream": stream}
        if stream:
            b["stream_options"] = {"include_usage": True}
        b.update(extra)
        return b

    def post(self, url, body, timeout=60.0):
        return self.http.post(url, json=body, timeout=timeout)

    def post_explained(self, url, body, explained):
        """A gateway request that asks for its routing decision (x-infergate-explain); the
        decision is appended to `explained` (printed when a routing assertion fails)."""
        r = self.http.post(url, json=body, timeout=60.0, headers={"x-infergate-explain": "1"})
        explained.append(r.headers.get("x-infergate-explain", "-"))
        return r

    def stream(self, url, body, client=None, on_headers=None, timeout=60.0):
        """One streamed request; returns status, endpoint, ttft, inter-token gaps, usage."""
        c = client or self.http
        t0 = time.monotonic()
        res = {"status": None, "endpoint": None, "ttft": None, "itl": [], "usage": None,
               "error": None, "t_headers": None, "tokens": 0, "t_start": t0}
        try:
            with c.stream("POST", url, json=body, timeout=timeout) as r:
                res["status"] = r.status_code
                res["endpoint"] = r.headers.get("x-infergate-endpoint")
                res["t_headers"] = time.monotonic()
                if on_headers:
                    on_headers(res)
                if r.status_code != 200:
                    res["body"] = r.read().decode(errors="replace")
                    return res
                last = None
                done = False
                # SSE lines end at b"\n" only: httpx's iter_lines() also splits on U+0085 and
                # U+2028, which JSON leaves unescaped and a random-weight model does emit.
                buf = b""
                for line in self._sse_lines(r, buf):
                    if not line.startswith(b"data: "):
                        continue
                    data = line[6:]
                    if data == b"[DONE]":
                        done = True
                        break
                    ev = json.loads(data)
                    if ev.get("usage"):
                        res["usage"] = ev["usage"]
                    ch = ev.get("choices") or []
                    if ch and (ch[0].get("text") or (ch[0].get("delta") or {}).get("content")):
                        now = time.monotonic()
                        if last is None:
                            res["ttft"] = now - t0
                        else:
                            res["itl"].append(now - last)
                        last = now
                        res["tokens"] += 1
                if not done:
                    res["error"] = "stream ended without [DONE]"
        except (httpx.HTTPError, json.JSONDecodeError) as e:
            res["error"] = f"{type(e).__name__}: {e}"
        res["t_end"] = time.monotonic()
        return res

    @staticmethod
    def _sse_lines(resp, buf):
        for chunk in resp.iter_bytes():
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                yield line.rstrip(b"\r")
        if buf:
            yield buf

    class Background:
        """N worker threads sending streamed requests in a loop until stop(); bounded by a
        deadline and a request count."""

        def __init__(self, suite, url, body_fn, workers, max_seconds=120, max_requests=2000):
            self.results = []
            self._stop = threading.Event()
            self._lock = threading.Lock()
            self._n = 0
            self.clients = []
            deadline = time.monotonic() + max_seconds

            def run(w):
                client = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0))
                with self._lock:
                    self.clients.append(client)
                try:
                    while not self._stop.is_set() and time.monotonic() < deadline:
                        with self._lock:
                            if self._n >= max_requests:
                                return
                            self._n += 1
                            i = self._n
                        body = body_fn(w, i)
                        if body.get("stream"):
                            r = suite.stream(url, body, client=client)
                        else:
                            # not streamed: the API server stays idle while the engine works,
                            # so /metrics keeps answering promptly
                            try:
                                resp = client.post(url, json=body)
                                r = {"status": resp.status_code, "error": None,
                                     "endpoint": resp.headers.get("x-infergate-endpoint")}
                            except (httpx.HTTPError, RuntimeError) as e:
                                # (RuntimeError: the client closed under it by stop(abort=True))
                                r = {"status": None, "error": str(e), "endpoint": None}
                        with self._lock:
                            self.results.append(r)
                finally:
                    client.close()

            self.threads = [threading.Thread(target=run, args=(w,), daemon=True)
                            for w in range(workers)]
            for t in self.threads:
                t.start()

        def stop(self, timeout=60, abort=False):
            """Stops the workers after their current request, or with `abort` at once: their
            connections are closed, which makes vLLM abort the requests in flight."""
            self._stop.set()
            if abort:
                with self._lock:
                    clients = list(self.clients)
                for c in clients:
                    try:
                        c.close()
                    except Exception:  # noqa: BLE001 - closing under a busy thread may raise
                        pass
            for t in self.threads:
                t.join(timeout)

    # ------------------------------------------------------------------ check 1
    def check_gateway_sdk(self):
        import openai
        client = openai.OpenAI(base_url=self.gw("/v1"), api_key="unused", max_retries=0,
                               timeout=60)
        x = {"ignore_eos": True}
        # chat, not streamed
        raw = client.chat.completions.with_raw_response.create(
            model=MODEL, messages=[{"role": "user", "content": "say something"}], max_tokens=8,
            extra_body=x)
        chat = raw.parse()
        ep = raw.headers.get("x-infergate-endpoint")
        expect(chat.choices[0].message.content is not None and chat.usage.completion_tokens == 8,
               f"chat: {chat.usage.completion_tokens} completion tokens (want 8), "
               f"{chat.usage.prompt_tokens} prompt tokens, served by {self.inst_of(ep)}")
        # chat, streamed with usage
        chunks, usage, text = 0, None, ""
        for ev in client.chat.completions.create(
                model=MODEL, messages=[{"role": "user", "content": "count numbers"}],
                max_tokens=12, stream=True, stream_options={"include_usage": True},
                extra_body=x):
            if ev.usage:
                usage = ev.usage
            if ev.choices and ev.choices[0].delta.content:
                chunks += 1
                text += ev.choices[0].delta.content
        expect(usage is not None and usage.completion_tokens == 12 and chunks >= 1,
               f"chat stream: {chunks} content chunks, usage chunk "
               f"{'present' if usage else 'MISSING'} ({usage.completion_tokens if usage else '-'}"
               " completion tokens, want 12)")
        # completions, not streamed and streamed
        comp = client.completions.create(model=MODEL, prompt="the quick brown fox",
                                         max_tokens=8, extra_body=x)
        expect(comp.usage.completion_tokens == 8 and comp.choices[0].text is not None,
               f"completion: {comp.usage.completion_tokens} tokens, text {comp.choices[0].text!r}")
        chunks, usage = 0, None
        for ev in client.completions.create(model=MODEL, prompt="the lazy dog", max_tokens=10,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body=x):
            if ev.usage:
                usage = ev.usage
            if ev.choices and ev.choices[0].text:
                chunks += 1
        expect(usage is not None and usage.completion_tokens == 10,
               f"completion stream: {chunks} text chunks, usage chunk "
               f"{'present' if usage else 'MISSING'}")
        # LoRA by name (lora-b: lora-a is kept untouched for the routing check)
        raw = client.chat.completions.with_raw_response.create(
            model="lora-b", messages=[{"role": "user", "content": "hello"}], max_tokens=4,
            extra_body=x)
        lc = raw.parse()
        expect(lc.model == "lora-b" and lc.usage.completion_tokens == 4,
               f"LoRA by name: model in answer {lc.model!r}, served by "
               f"{self.inst_of(raw.headers.get('x-infergate-endpoint'))}")
        models = [m.id for m in client.models.list()]
        expect({"tiny", "lora-a", "lora-b"} <= set(models), f"/v1/models lists {models}")
        # vLLM's shape for each entry: an adapter's `parent` is its base model, a base model's
        # is null; the gateway's list must say what the engines' own lists say.
        listed = {m["id"]: m for m in self.http.get(self.gw("/v1/models")).json()["data"]}
        engines = {}
        for k in ("A", "B"):
            for m in self.http.get(self.url(k, "/v1/models")).json()["data"]:
                engines.setdefault(m["id"], m)
        parents = {i: (listed.get(i, {}).get("parent", "MISSING"),
                       engines.get(i, {}).get("parent", "MISSING"))
                   for i in ("tiny", "lora-a", "lora-b")}
        expect(all(g == e != "MISSING" for g, e in parents.values())
               and parents["lora-a"][1] == "tiny",
               f"/v1/models parent (gateway, vLLM): {parents}")
        # errors, as JSON
        try:
            client.chat.completions.create(model="no-such-model",
                                           messages=[{"role": "user", "content": "x"}])
            expect(False, "unknown model was answered")
        except openai.NotFoundError as e:
            body = e.response.json()
            expect(e.status_code == 404 and "error" in body,
                   f"unknown model: {e.status_code}, code {body['error'].get('code')!r}, "
                   f"message {body['error'].get('message', '')[:80]!r}")
        r = self.http.post(self.gw("/v1/chat/completions"), content=b'{"model": "tiny", ',
                           headers={"content-type": "application/json"})
        expect(r.status_code == 400 and "error" in r.json(),
               f"bad body: {r.status_code}, code {r.json()['error'].get('code')!r}")
        try:
            client.completions.create(model=MODEL, prompt="x" * 70000, max_tokens=1)
            expect(False, "a 70 kB body was answered")
        except openai.APIStatusError as e:
            body = e.response.json()
            expect(e.status_code == 413 and "error" in body,
                   f"too large (70 kB, limit 64 KiB): {e.status_code}, "
                   f"code {body['error'].get('code')!r}")
        m = self.gw_metrics()
        picks = {self.inst_of(l.get("endpoint")): v for n, l, v in parse_samples(m)
                 if n == "infergate_gateway_picks_total"}
        print(f"    picks so far: {picks}")

    # ------------------------------------------------------------------ check 2
    def check_extproc(self):
        import grpc
        import extproc_client as xp
        models = os.path.join(self.work, "models.yaml")
        with open(models, "w") as f:
            f.write(f"{MODEL}: [lora-a, lora-b]\n")
        eps = os.path.join(self.work, "endpoints.yaml")
        with open(eps, "w") as f:
            f.write("engine: vllm\nnamespace: default\nendpoints:\n" + "".join(
                f"  - {{address: {self.addr(i)}, name: vllm-{i}}}\n" for i in ("A", "B")))
        bbr_port = free_port()
        self.procs.start("bbr", [self.a.bin, "bbr", "--listen-address", LOCAL, "--models", models, "--grpc-port",
                                 str(bbr_port), "--grpc-health-port", "0", "--metrics-port", "0"],
                         env={"RUST_LOG": "info"})
        pk_port, pk_health, pk_metrics = free_port(), free_port(), free_port()
        self.procs.start("picker", [self.a.bin, "picker", "--listen-address", LOCAL, "--endpoints-file", eps,
                                    "--pool-name", MODEL, "--pool-namespace", "default",
                                    "--grpc-port", str(pk_port), "--grpc-health-port",
                                    str(pk_health), "--metrics-port", str(pk_metrics)],
                         env={"RUST_LOG": "info"})
        try:
            wait_until(lambda: http_ok(f"http://{LOCAL}:{pk_metrics}/readyz"), 30, 0.2,
                       "picker /readyz")
            bbr_ch = grpc.insecure_channel(f"{LOCAL}:{bbr_port}")
            pk_ch = grpc.insecure_channel(f"{LOCAL}:{pk_port}")
            grpc.channel_ready_future(bbr_ch).result(timeout=20)
            grpc.channel_ready_future(pk_ch).result(timeout=20)
            for path, body_obj in [
                ("/v1/chat/completions", {"model": "lora-b", "max_tokens": 6, "ignore_eos": True,
                                          "messages": [{"role": "user",
                                                        "content": "route me " * 40}]}),
                ("/v1/completions", {"model": MODEL, "max_tokens": 6, "ignore_eos": True,
                                     "prompt": "hello from the ext_proc client " * 30}),
            ]:
                body = json.dumps(body_obj, separators=(", ", ": ")).encode()
                t0 = time.monotonic()
                st, b = xp.request(bbr_ch, path, body, chunk=100)
                st.close()
                base = MODEL
                expect(b["headers"].get("x-gateway-model-name") == body_obj["model"]
                       and b["headers"].get("x-gateway-base-model-name") == base
                       and b["clear_route_cache"],
                       f"BBR {path}: x-gateway-model-name={b['headers'].get('x-gateway-model-name')}"
                       f", x-gateway-base-model-name={b['headers'].get('x-gateway-base-model-name')}"
                       f", clear_route_cache={b['clear_route_cache']}")
                expect(b["body"] == body, f"BBR re-sent the body byte-identical "
                       f"({len(b['body'])} of {len(body)} bytes, chunks {b['body_chunks']})")
                st, p = xp.request(pk_ch, path, body, chunk=100, headers=[
                    ("x-gateway-model-name", b["headers"]["x-gateway-model-name"]),
                    ("x-gateway-base-model-name", b["headers"]["x-gateway-base-model-name"])])
                pick_ms = (time.monotonic() - t0) * 1000
                dest = p["headers"].get("x-gateway-destination-endpoint", "")
                md = (p["metadata"] or {}).get("envoy.lb", {}).get(
                    "x-gateway-destination-endpoint")
                first = dest.split(",")[0]
                expect(first in (self.addr("A"), self.addr("B")) and md == dest,
                       f"picker {path}: destination {dest!r} (= vLLM {self.inst_of(first)}), "
                       f"envoy.lb metadata {md!r}, bbr+picker {pick_ms:.1f} ms")
                expect(p["body"] == body and int(p["headers"].get("content-length", -1))
                       == len(body),
                       f"picker re-sent the body byte-identical ({len(p['body'])} bytes in "
                       f"chunks {p['body_chunks']}), content-length "
                       f"{p['headers'].get('content-length')}")
                r = self.http.post(f"http://{first}{path}", content=p["body"],
                                   headers={"content-type": "application/json"})
                expect(r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 6,
                       f"forwarded to {first}: {r.status_code}, "
                       f"{r.json().get('usage', {}).get('completion_tokens')} tokens")
                back = xp.response(st, r.status_code, r.content)
                expect(back == r.content, f"picker passed the {len(r.content)}-byte response "
                       "through unchanged")
            # a body over one 62,000-byte chunk comes back identical in the fewest chunks
            big = json.dumps({"model": MODEL, "prompt": "z" * 150000, "max_tokens": 1}).encode()
            st, p = xp.request(pk_ch, "/v1/completions", big, chunk=16384)
            st.close()
            expect(p["body"] == big and p["body_chunks"] == [62000, 62000, len(big) - 124000],
                   f"150 kB body: identical, re-sent in chunks {p['body_chunks']}")
            st, p = xp.request(bbr_ch, "/v1/completions",
                               json.dumps({"model": "nope", "prompt": "x"}).encode())
            st.close()
            im = p["immediate"] or {}
            expect(im.get("status") == 404 and b"model_not_found" in im.get("body", b""),
                   f"BBR unknown model: immediate {im.get('status')} {im.get('body', b'')[:90]!r}")
            m = scrape(f"http://{LOCAL}:{pk_metrics}/metrics")
            ok = metric(m, "infergate_extproc_requests_total", outcome="success")
            print(f"    picker counted {ok:.0f} successful requests")
            expect(ok >= 2, f"picker infergate_extproc_requests_total{{outcome=success}} = {ok:.0f} (want 2)")
            bbr_ch.close()
            pk_ch.close()
        finally:
            self.procs.stop("bbr")
            self.procs.stop("picker")

    # ------------------------------------------------------------------ check 3
    def check_routing(self):
        ua = self.url("A", "/v1/completions")
        gw = self.gw("/v1/completions")
        tag = random.randrange(1 << 30)

        # (a) LoRA: lora-a runs on A only (a background stream there), requests for it follow.
        # A cold instance loads the adapter and warms its LoRA kernels on the first request for
        # it (tens of seconds on these cores when this check runs alone): one short request
        # first, so the background stream below is running within the wait that follows.
        t_warm = time.monotonic()
        warm = self.post(ua, self.completion_body(model="lora-a", prompt="warm", max_tokens=1),
                         timeout=180.0)
        expect(warm.status_code == 200,
               f"warm-up request for lora-a on A: {warm.status_code} {warm.text[:160]}")
        print(f"    lora-a warm on A in {time.monotonic() - t_warm:.1f}s")
        # Two workers of different lengths (the model is fast: 1,900 tokens take about 5 s), so
        # that one of them is always running: with one, A's page between two of its requests
        # shows the adapter idle, and a router reading that page rightly sees a free slot.
        held = self.Background(self, ua, lambda w, i: self.completion_body(
            model="lora-a", prompt=f"hold {w} {i}", max_tokens=1900 - 600 * w, ignore_eos=True),
            2, max_seconds=90)
        wait_until(lambda: "lora-a" in lora_state(scrape(self.url("A", "/metrics"),
                                                         timeout=30))[0], 45,
                   0.05, "lora-a running on A")
        # ... and the gateway has read a page of A that says so (a slow page makes A late, and
        # the gateway routes on the page it has).
        t_seen = time.monotonic()
        wait_until(lambda: self.gw_pod(self.gw_metrics(), "infergate_pod_lora_adapter_info", "A",
                                       adapter="lora-a", state="running") == 1, 90, 0.05,
                   "the gateway's page of A showing lora-a running")
        print(f"    the gateway saw lora-a running on A {time.monotonic() - t_seen:.2f}s after "
              "A's own page did")
        served = []
        explained = []
        states = []  # the gateway's scrape state of A/B before each request
        for i in range(6):
            g = self.gw_metrics()
            states.append("/".join(self.gw_scrape_state(g, x) for x in ("A", "B")))
            r = self.post_explained(gw, self.completion_body(
                model="lora-a", prompt=f"adapter {tag} {i}", max_tokens=4), explained)
            served.append(self.inst_of(r.headers.get("x-infergate-endpoint")))
            if r.status_code != 200:
                served[-1] = f"{served[-1]}({r.status_code}: {r.text[:160]})"
        held.stop(abort=True)
        ra, seen_a = lora_state(scrape(self.url("A", "/metrics")))
        rb, seen_b = lora_state(scrape(self.url("B", "/metrics")))
        if served.count("A") != len(served):
            print("    routing decisions:\n      " + "\n      ".join(explained))
        expect(served.count("A") == len(served),
               f"lora-a requests (adapter running on A only): served by {served} (gateway's "
               f"scrape state of A/B before each: {states})")
        expect("lora-a" in seen_a and "lora-a" not in seen_b,
               f"instances' own vllm:lora_requests_info: A has seen {sorted(seen_a)}, "
               f"B has seen {sorted(seen_b)}")

        # (b) prefix: a long prompt repeated goes back where its blocks are cached.
        words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
        rng = random.Random(tag)
        long_prompt = f"[{tag}] " + " ".join(rng.choice(words) for _ in range(90))

        def hits():
            return {i: metric(scrape(self.url(i, "/metrics")), "vllm:prefix_cache_hits_total")
                    for i in ("A", "B")}

        h0 = hits()
        first = self.post(gw, self.completion_body(prompt=long_prompt, max_tokens=2))
        p_tokens = first.json()["usage"]["prompt_tokens"]
        where = [self.inst_of(first.headers.get("x-infergate-endpoint"))]
        for i in range(3):
            r = self.post(gw, self.completion_body(prompt=long_prompt, max_tokens=2))
            where.append(self.inst_of(r.headers.get("x-infergate-endpoint")))
        h1 = hits()
        rose = {i: h1[i] - h0[i] for i in h0}
        x = where[0]
        other = "B" if x == "A" else "A"
        cfg = [l for n, l, _ in parse_samples(scrape(self.url(x, "/metrics")))
               if n == "vllm:cache_config_info"]
        bs = int(cfg[0].get("block_size", 16)) if cfg else 16
        want = 3 * ((p_tokens - 1) // bs) * bs  # whole blocks, the last token always computed
        expect(all(w == x for w in where) and rose[x] >= want and rose[other] == 0,
               f"prompt of {p_tokens} tokens sent 4 times: served by {where}; "
               f"prefix_cache_hits_total rose A +{rose['A']:.0f}, B +{rose['B']:.0f} "
               f"(want >= {want} on {x}: 3 repeats x whole {bs}-token blocks, 0 elsewhere)")

        # (c) load sent to A directly moves new requests to B.
        # Not streamed and long: vLLM's API server detokenizes on its event loop, so a scrape of
        # a busy instance can take seconds; few long requests keep A visibly busy.
        # Twelve of them overfill A's 64 KV blocks (8,192 tokens) by far, so A keeps queueing: a
        # load every router must see, not only one its model of batching may discount. (With
        # eight, vLLM's preemption left A with nothing waiting at most sampled moments.)
        direct = 12
        # Lengths differ per worker, so their requests do not all end (and A empty) at once. The
        # load runs until the new requests below are done (stopped there); its deadline is only a
        # bound, and a loose one: on a slow run (A took a minute to queue, the gateway's page of
        # A half a minute more) A's page went idle four new requests in, and the 240 s deadline
        # it had then may have been why.
        load = self.Background(self, ua, lambda w, i: self.completion_body(
            prompt=f"load {tag} {w} {i}", max_tokens=1900 - 50 * w, ignore_eos=True), direct,
            max_seconds=600)
        # Asserted while A is loaded as every router must see it: requests waiting, or its KV
        # cache (nearly) full. A running batch alone counts in the scheduler's estimate only as
        # the decode step a new prefill would share (docs/scheduler.md, `step_p`); on this tiny
        # CPU model that is of the order of the learned speeds' own noise between two identical
        # instances, so it is not asserted on (docs/testing.md, "Real vLLM suite", has figures).
        def a_page():
            text = scrape(self.url("A", "/metrics"), timeout=30)
            return (metric(text, "vllm:num_requests_running"),
                    metric(text, "vllm:num_requests_waiting"),
                    metric(text, "vllm:kv_cache_usage_perc"))

        def loaded(run, wait, kv):
            return wait >= 1 or kv >= 0.9

        t_load = time.monotonic()
        wait_until(lambda: loaded(*a_page()), 180, 0.1,
                   "A loaded on its own page (requests waiting or its KV 0.9+ full)")
        print(f"    A loaded {time.monotonic() - t_load:.1f}s after the load started")
        # The routing signal is the gateway's page of A: wait (bounded) until it shows A loaded.
        # A slow page only makes A late; the gateway keeps routing on the page it has.
        t_seen = time.monotonic()

        def gw_sees_load():
            g = self.gw_metrics()
            return loaded(self.gw_pod(g, "infergate_pod_running_requests", "A"),
                          self.gw_pod(g, "infergate_pod_waiting_requests", "A"),
                          self.gw_pod(g, "infergate_pod_kv_cache_usage_ratio", "A"))
        wait_until(gw_sees_load, 90, 0.05,
                   "the gateway's page of A showing it loaded")
        print(f"    the gateway's page of A showed it loaded {time.monotonic() - t_seen:.2f}s "
              "after A's own page did")
        served = []
        explained = []
        load_a = []
        states = []

        def both_loaded():
            # Moments when A's own page (read just before the request) and the page the
            # gateway decided on (from the decision itself) both showed A loaded. vLLM's page
            # swings from one moment to the next (preemption re-queues requests; with its API
            # server's event loop blocked, the engine can even run dry for an instant), so the
            # two pages, read at different moments, do not always agree; a decision taken on a
            # page that showed A idle is not one about load. Nor is one B could not take: its
            # page too old to route on (its API server, on these two cores, can be slow to
            # answer while it serves the new requests) or B saturated — the gateway then has
            # only A (or neither) to choose, and must not be held to choosing B.
            out = []
            for w, page, ex in zip(served, load_a, explained):
                seen = self.decision_view(ex, "A")
                b = self.decision_view(ex, "B")
                b_open = b is not None and b[0] != float("inf")
                if (loaded(*page) and seen is not None and loaded(seen[2], seen[0], seen[1])
                        and b_open):
                    out.append(w)
            return out

        # New requests until four were decided while both pages showed A loaded (or 40 in all:
        # vLLM preempts and re-admits under this load, and A's page can show a full batch with
        # nothing waiting and its KV cache a fifth full for a dozen requests in a row).
        for i in range(40):
            if len(both_loaded()) >= 4:
                break
            g = self.gw_metrics()
            states.append("/".join(self.gw_scrape_state(g, x) for x in ("A", "B")))
            load_a.append(a_page())
            r = self.post_explained(gw, self.completion_body(prompt=f"new {tag} {i}",
                                                             max_tokens=4), explained)
            inst = self.inst_of(r.headers.get("x-infergate-endpoint"))
            if r.status_code != 200:
                inst = f"{inst}({r.status_code}: {r.text[:120]})"
            served.append(inst)
            time.sleep(0.1)
        load.stop(abort=True)
        # An answer other than a routing decision (a 429 shed, a 503) is not asserted on here,
        # but its decision says why the gateway gave it: printed in every run.
        for inst, ex, st in zip(served, explained, states):
            if "(" in inst:
                print(f"    not routed: {inst}\n      scrape state of A/B before it: {st}\n"
                      f"      decision: {ex}")
        busy = both_loaded()
        if len(busy) < 3 or busy.count("B") != len(busy):
            print("    routing decisions:\n      " + "\n      ".join(explained))
        shown = [f"{run:.0f}+{wait:.0f} kv {kv:.2f}" for run, wait, kv in load_a]
        seen = [self.decision_view(ex, "A") for ex in explained]
        seen = ["-" if v is None else "saturated" if v[0] == float("inf")
                else f"{v[2]:.0f}+{v[0]:.0f} kv {v[1]:.2f}" for v in seen]
        expect(len(busy) >= 3 and busy.count("B") == len(busy),
               f"with A running+waiting {shown} on its own page and {seen} on the page each "
               f"decision saw, of its {direct} direct requests: new requests served by {served} "
               f"(gateway's scrape state of A/B before each: {states}); decided while both "
               f"showed A loaded (requests waiting or KV 0.9+ full): {busy} (want all B, at "
               f"least 3)")

    # ------------------------------------------------------------------ check 4
    def check_faults(self):
        gw = self.gw("/v1/completions")
        # A repeated run (REAL_VLLM_REPEAT) finds both instances killed by the run before.
        down = [i for i in ("A", "B") if not self.procs.alive(f"vllm-{i}")]
        for inst in down:
            self.start_vllm(inst)
        for inst in down:
            self.wait_vllm(inst)
        if down:
            wait_until(lambda: metric(self.gw_metrics(), "infergate_metrics_stale_targets") == 0,
                       10, 0.05, "both instances fresh again in the gateway")
        threshold = (STALE_AFTER_MS + SCRAPE_INTERVAL_MS) / 1000
        kill_at = {}

        def mark(res):
            res["started_before_kill"] = "t" not in kill_at

        bodies = lambda w, i: self.completion_body(prompt=f"fault {w} {i}", max_tokens=120,
                                                   stream=True)
        results = []
        stop = threading.Event()

        def worker(w):
            client = httpx.Client(timeout=httpx.Timeout(60.0, connect=5.0))
            for i in range(400):
                if stop.is_set():
                    break
                results.append(self.stream(gw, bodies(w, i), client=client, on_headers=mark))
            client.close()

        ths = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(3)]
        for t in ths:
            t.start()
        time.sleep(3)
        pa = self.procs.procs["vllm-A"]
        # SIGKILL is not the end of A's sockets: the kernel frees a process's memory before it
        # closes its files. The API server dies first (its streams break), but the listening
        # socket is also held by the engine core, which inherited it and takes up to a second
        # (3 GB) to go; until then a connection to A's port is accepted into the backlog and
        # hangs. The gateway can only see A gone once the port refuses; record when it does,
        # from a process of its own (a thread here would wait for the streaming threads' GIL).
        watcher = subprocess.Popen(
            [sys.executable, "-c", WATCH_PORT, LOCAL, str(self.vllm_ports["A"]),
             str(time.time() + 15)],
            stdout=subprocess.PIPE, text=True)
        time.sleep(0.1)  # polling before the kill
        os.killpg(pa.pid, signal.SIGKILL)  # the whole group: API server, engine core, worker
        kill_at["t"] = time.monotonic()
        kill_wall = time.time()
        refused = {}
        stale_at = None
        polls = [kill_at["t"]]
        deadline = time.monotonic() + 15
        poll_durations = []
        while time.monotonic() < deadline:
            t_poll = time.monotonic()
            stale_now = metric(self.gw_metrics(), "infergate_metrics_stale_targets") >= 1
            polls.append(time.monotonic())
            poll_durations.append(polls[-1] - t_poll)
            if stale_now:
                stale_at = polls[-1]
                break
            time.sleep(0.02)
        poll_gap = max(b - a for a, b in zip(polls, polls[1:]))
        self.procs.stop("vllm-A", sig=signal.SIGKILL)  # reap it
        log("killed vLLM A (SIGKILL) under load")
        time.sleep(3)
        stop.set()
        for t in ths:
            t.join(70)
        t_kill = kill_at["t"]
        failed = [r for r in results if r["status"] != 200 or r["error"]]
        # A 200 from A: A sent its headers before it died, so the stream had started there.
        streaming_from_a = [r for r in failed
                            if self.inst_of(r["endpoint"]) == "A" and r["status"] == 200]
        lost = [r for r in failed if r not in streaming_from_a]
        after = [r for r in results if r["t_start"] > t_kill]
        to_b_after = sum(1 for r in after if self.inst_of(r["endpoint"]) == "B")
        stale_s = (stale_at - t_kill) if stale_at else float("inf")
        print(f"    {len(results)} streamed requests; {len(failed)} failed, of which "
              f"{len(streaming_from_a)} were already streaming from A; {len(after)} started "
              f"after the kill ({to_b_after} on B)")
        with open(os.path.join(self.reports, "faults-failed-requests.json"), "w") as f:
            json.dump([{"endpoint": r["endpoint"], "status": r["status"], "error": r["error"],
                        "tokens": r["tokens"], "usage": r["usage"],
                        "start_after_kill_s": r["t_start"] - t_kill,
                        "headers_after_kill_s": (r["t_headers"] - t_kill) if r["t_headers"]
                        else None,
                        "end_after_kill_s": r.get("t_end", 0) - t_kill,
                        "classified": "streaming from A" if r in streaming_from_a else "lost"}
                       for r in failed], f, indent=1)
        for r in lost[:5]:
            print(f"      lost: status {r['status']} endpoint {r['endpoint']} error {r['error']} "
                  f"{r.get('body', '')[:120]}")
        soft = []  # the later parts still run when one of these fails

        def check(cond, what):
            try:
                expect(cond, what)
            except CheckFailed as e:
                soft.append(str(e))

        check(not lost, f"no request lost except those streaming from A ({len(lost)} lost)")
        # When the gateway judged A failed, from its own log line (this process's polling of
        # the admin page competes with three streaming threads and lags by up to seconds).
        try:
            out = watcher.communicate(timeout=16)[0].strip()
        except subprocess.TimeoutExpired:
            watcher.kill()
            out = watcher.communicate()[0].strip()
        if out:
            refused["t"] = float(out)
        # Either way of learning it: A's scrape failing, or a request's connection to A refused.
        marks = [self.gateway_log_time(text, self.addr("A"), kill_wall)
                 for text in ("metrics target failed", "connection to the endpoint refused")]
        failed_at = min([t for t in marks if t is not None], default=None)
        # A is gone once its port refuses; a stream breaking says only that the API server died.
        broke = [kill_wall + (r["t_end"] - t_kill) for r in streaming_from_a if r.get("t_end")]
        gone = refused.get("t") or min(broke, default=None)
        after_gone = (failed_at - gone) if failed_at and gone else float("inf")
        # A gateway short of CPU judges every pod that much late, and says so: its scraper logs
        # each stall of its thread past the staleness threshold ("metrics scraper stalled …
        # delay_ms=N", stamped when the thread ran again). Stalls within the wait for A's failure
        # extend the bound by their length; they do not excuse anything else.
        stalled = 0.0
        if failed_at and gone:
            for t, line in self.gateway_log(None):
                m = re.search(r"metrics scraper stalled.*delay_ms=(\d+)", line)
                if m:
                    s0, s1 = t - int(m.group(1)) / 1000, t
                    stalled += max(0.0, min(s1, failed_at) - max(s0, gone))
        check(after_gone <= threshold + stalled,
              f"gateway marked A failed {after_gone * 1000:.0f} ms after A's port refused "
              f"connections (bound: threshold {STALE_AFTER_MS} + interval {SCRAPE_INTERVAL_MS} "
              f"ms + the gateway's own reported scraper stalls in that wait, "
              f"{stalled * 1000:.0f} ms; by the gateway's log; the port refused "
              f"{((refused.get('t') or kill_wall) - kill_wall) * 1000:.0f} ms after the SIGKILL, "
              f"streams from A broke after "
              f"{((min(broke, default=kill_wall)) - kill_wall) * 1000:.0f} ms; this "
              f"suite's polls of the admin page saw it {stale_s * 1000:.0f} ms after the kill)")
        if after_gone > threshold:
            for t, line in self.gateway_log(None):
                if kill_wall - 0.5 <= t <= kill_wall + 8 and (
                        self.addr("A") in line or "scraper stalled" in line):
                    print(f"      gateway: {line[:300]}")
        # restart A, readmitted
        t0 = time.monotonic()
        self.start_vllm("A")
        dt = self.wait_vllm("A")
        wait_until(lambda: metric(self.gw_metrics(), "infergate_metrics_stale_targets") == 0,
                   10, 0.02, "A fresh again in the gateway")
        fresh = time.monotonic() - t0
        # readmitted = eligible again: pairs of concurrent requests (in-flight accounting sends
        # the second of a pair elsewhere if the first's pod is as good)
        served = []
        with cf.ThreadPoolExecutor(2) as ex:
            for i in range(15):
                futs = [ex.submit(self.post, gw, self.completion_body(
                    prompt=f"back {i} {j}", max_tokens=64)) for j in range(2)]
                served += [self.inst_of(f.result().headers.get("x-infergate-endpoint"))
                           for f in futs]
                if "A" in served:
                    break
                time.sleep(0.2)
        g = self.gw_metrics()
        with open(os.path.join(self.reports, "faults-gateway-after-restart.txt"), "w") as f:
            f.write(g)
        pods = {i: {k: self.gw_pod(g, f"infergate_pod_{k}", i) for k in
                    ("inflight_requests", "prefill_tokens_per_second", "waiting_requests",
                     "running_requests")} for i in ("A", "B")}
        check("A" in served, f"A restarted: healthy after {dt:.1f}s, fresh in the gateway after "
              f"{fresh:.1f}s, first requests served by {served} (gateway's view then: {pods})")
        # both dead: 503 with Retry-After
        self.procs.stop("vllm-A", sig=signal.SIGKILL)
        self.procs.stop("vllm-B", sig=signal.SIGKILL)
        wait_until(lambda: metric(self.gw_metrics(), "infergate_metrics_stale_targets") >= 2,
                   10, 0.05, "both instances stale")
        r = self.post(gw, self.completion_body(max_tokens=2), timeout=30)
        body = r.text[:200]
        check(r.status_code == 503 and r.headers.get("retry-after") is not None,
              f"both instances dead: {r.status_code}, Retry-After "
              f"{r.headers.get('retry-after')!r}, body {body!r}")
        if soft:
            raise CheckFailed("; ".join(soft))

    def gateway_log(self, addr):
        """(wall time, line) of every stamped gateway log line that names `addr` (every line
        with None)."""
        import datetime
        path = os.path.join(self.work, "logs", "gateway.log")
        try:
            with open(path, errors="replace") as f:
                lines = f.read().splitlines()
        except OSError:
            return []
        out = []
        for line in lines:
            if addr is not None and addr not in line:
                continue
            try:
                t = datetime.datetime.fromisoformat(
                    line.split()[0].replace("Z", "+00:00")).timestamp()
            except (ValueError, IndexError):
                continue
            out.append((t, line))
        return out

    def gateway_log_lines(self, addr, start, end):
        """The gateway's log lines naming `addr` stamped between `start` and `end` (wall)."""
        return [line for t, line in self.gateway_log(addr) if start <= t <= end]

    def gateway_log_time(self, text, addr, after):
        """Wall time of the first gateway log line at or after `after` that contains `text`
        and names `addr` (as `…={addr}`), or None."""
        return next((t for t, line in self.gateway_log(addr)
                     if text in line and f"={addr}" in line and t >= after - 0.05), None)

    # ------------------------------------------------------------------ check 5
    def check_emulator(self):
        fleet = os.path.join(self.work, "fleet.yaml")
        port = free_port()
        with open(fleet, "w") as f:
            f.write(f"seed: 1\npods:\n  - {{name: vllm, profile: llama-3.1-8b/h100, engine: "
                    f"vllm, port: {port}, lora_adapters: [lora-a, lora-b], max_loras: 2}}\n")
        self.procs.start("sim", [self.a.bin, "sim", "--fleet", fleet])
        try:
            wait_until(lambda: http_ok(f"http://{LOCAL}:{port}/health"), 30, 0.2, "emulator pod")
            # one request each way so lazily created series exist on both pages
            for base in (f"http://{LOCAL}:{port}", f"http://{self.addr('B')}"):
                self.post(base + "/v1/completions", self.completion_body(
                    model="lora-a" if base.endswith(str(port)) else "lora-b", max_tokens=2))
                self.post(base + "/v1/chat/completions", {
                    "model": "llama-3.1-8b" if base.endswith(str(port)) else MODEL,
                    "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
            emu_text = scrape(f"http://{LOCAL}:{port}/metrics")
            live_text = scrape(self.url("B", "/metrics"))
            with open(os.path.join(self.reports, "emulator-vllm-metrics.txt"), "w") as f:
                f.write(emu_text)
            with open(os.path.join(self.reports, "live-vllm-metrics.txt"), "w") as f:
                f.write(live_text)
            emu = {k: v for k, v in parse_families(emu_text).items() if k.startswith("vllm:")}
            live = parse_families(live_text)
            diffs = []
            for name, e in sorted(emu.items()):
                l = live.get(name)
                if l is None:
                    diffs.append(f"  {name}: emulator {e['type']} {sorted(e['labels'])}; "
                                 "live page has no such family")
                elif l["type"] != e["type"] or l["labels"] != e["labels"]:
                    diffs.append(f"  {name}: emulator {e['type']} {sorted(e['labels'])}; "
                                 f"live {l['type']} {sorted(l['labels'])}")
            print(f"    emulator emits {len(emu)} vllm: families; live page has "
                  f"{sum(1 for k in live if k.startswith('vllm:'))}")
            if diffs:
                print("    differences (emulator vs live vLLM 0.32.0):")
                print("\n".join(diffs))
            expect(not diffs, f"every emulated family matches the live page in name, type and "
                   f"label names ({len(diffs)} differ)")
        finally:
            self.procs.stop("sim")

    # ------------------------------------------------------------------ check 6
    def check_scrape_cost(self):
        self.procs.stop("gateway")  # no other scraper on A while measuring
        ua = self.url("A", "/v1/completions")

        def run_load(label, rnd):
            body = lambda w, i: self.completion_body(
                prompt=f"scrape cost {label} {rnd} {w} {i} the quick brown fox", max_tokens=128,
                stream=True)
            results = []

            def worker(w):
                c = httpx.Client(timeout=60)
                for i in range(8):
                    results.append(self.stream(ua, body(w, i), client=c))
                c.close()

            ths = [threading.Thread(target=worker, args=(w,)) for w in range(2)]
            for t in ths:
                t.start()
            for t in ths:
                t.join(120)
            return results

        conds = [("none", None), ("50 ms", 50), ("200 ms", 200)]
        acc = {c: {"ttft": [], "e2e": [], "err": 0, "scrapes": 0, "sums": {}} for c, _ in conds}
        hists = ("time_to_first_token", "inter_token_latency")
        for rnd in range(3):  # interleaved rounds, so drift on a shared machine hits all alike
            for label, interval in conds:
                before = scrape(self.url("A", "/metrics"), timeout=30)
                if interval:
                    _, admin = self.start_gateway(name="scraper", endpoints=[self.addr("A")],
                                                  interval_ms=interval, stale_ms=interval * 5,
                                                  timeout_ms=min(250, interval * 5))
                    time.sleep(0.5)
                    s0 = self._scrapes(admin)
                res = run_load(label, rnd)
                if interval:
                    acc[label]["scrapes"] += self._scrapes(admin) - s0
                    self.procs.stop("scraper")
                after = scrape(self.url("A", "/metrics"), timeout=30)
                for h in hists:  # vLLM's own view, from its histograms
                    for part in ("sum", "count"):
                        n = f"vllm:{h}_seconds_{part}"
                        acc[label]["sums"][(h, part)] = acc[label]["sums"].get((h, part), 0) + \
                            metric(after, n) - metric(before, n)
                for r in res:
                    if r["status"] != 200 or r["error"]:
                        acc[label]["err"] += 1
                        continue
                    acc[label]["ttft"].append(r["ttft"])
                    acc[label]["e2e"].append(r["t_end"] - r["t_start"])
        hdr = ("| scraper | requests | client TTFT p50 ms | client TTFT p90 ms | client e2e p50 ms"
               " | client e2e p90 ms | vLLM TTFT mean ms | vLLM ITL mean ms | scrapes |")
        sep = "|---|---|---|---|---|---|---|---|---|"
        rows = []
        print("    " + hdr)
        print("    " + sep)
        for label, _ in conds:
            a = acc[label]
            sm = a["sums"]
            mean = lambda h: sm.get((h, "sum"), 0) / max(1, sm.get((h, "count"), 0))
            row = (label, len(a["ttft"]), fmt_ms(pct(a["ttft"], 50)), fmt_ms(pct(a["ttft"], 90)),
                   fmt_ms(pct(a["e2e"], 50)), fmt_ms(pct(a["e2e"], 90)),
                   fmt_ms(mean("time_to_first_token")), f"{mean('inter_token_latency') * 1000:.2f}",
                   a["scrapes"])
            rows.append(row)
            print("    | " + " | ".join(str(x) for x in row) + " |")
        with open(os.path.join(self.reports, "scrape-cost.md"), "w") as f:
            f.write(hdr + "\n" + sep + "\n")
            for row in rows:
                f.write("| " + " | ".join(str(x) for x in row) + " |\n")
        self.start_main_gateway()
        errs = sum(acc[c]["err"] for c, _ in conds)
        expect(errs == 0 and all(len(acc[c]["ttft"]) == 48 for c, _ in conds),
               f"3 x 16 streamed requests per condition, {errs} errors")
        expect(acc["50 ms"]["scrapes"] > acc["200 ms"]["scrapes"] > 0,
               f"the scrapers did scrape ({acc['50 ms']['scrapes']} at 50 ms, "
               f"{acc['200 ms']['scrapes']} at 200 ms)")

    def _scrapes(self, admin):
        m = scrape(f"http://{LOCAL}:{admin}/metrics")
        total = 0.0
        for n, labels, v in parse_samples(m):
            if n == "infergate_metrics_scrape_duration_seconds_count":
                total += v
        return int(total)

    # ------------------------------------------------------------------ check 7
    def check_inference_perf(self):
        py = self.a.perf_python
        out = {}
        for target, base in (("gateway", f"http://{LOCAL}:{self.gw_port}"),
                             ("direct", f"http://{self.addr('A')}")):
            d = os.path.join(self.work, f"perf-{target}")
            shutil.rmtree(d, ignore_errors=True)
            os.makedirs(d)
            cfg = os.path.join(d, "config.yml")
            with open(cfg, "w") as f:
                f.write(f"""# written by tests/e2e/real-vllm/suite.py (same config for both targets)
load:
  type: constant
  stages:
    - rate: 4
      duration: 15
  num_workers: 1
api:
  type: completion
  streaming: true
server:
  type: vllm
  model_name: {MODEL}
  base_url: {base}
  ignore_eos: true
tokenizer:
  pretrained_model_name_or_path: {self.model_dir}
data:
  type: random
  input_distribution: {{min: 20, max: 200, mean: 100, std_dev: 40, total_count: 200}}
  output_distribution: {{min: 16, max: 64, mean: 32, std_dev: 10, total_count: 200}}
report:
  request_lifecycle:
    summary: true
    per_stage: false
    per_request: false
storage:
  local_storage:
    path: {d}/reports
""")
            t0 = time.monotonic()
            r = subprocess.run([py, "-m", "inference_perf.main", "--config_file", cfg],
                               capture_output=True, text=True, timeout=240, cwd=d,
                               env=dict(os.environ, HF_HUB_OFFLINE="1",
                                        TRANSFORMERS_OFFLINE="1"))
            with open(os.path.join(d, "inference-perf.log"), "w") as f:
                f.write(r.stdout + r.stderr)
            if r.returncode != 0:
                print((r.stdout + r.stderr)[-3000:])
            expect(r.returncode == 0, f"inference-perf against the {target}: exit "
                   f"{r.returncode} in {time.monotonic() - t0:.0f}s")
            summary = None
            for root, _, files in os.walk(os.path.join(d, "reports")):
                for fn in files:
                    if "summary" in fn and fn.endswith(".json"):
                        summary = os.path.join(root, fn)
            expect(summary is not None, f"{target}: summary report written ({summary})")
            dst = os.path.join(self.reports, f"inference-perf-{target}-summary.json")
            shutil.copy(summary, dst)
            out[target] = json.load(open(summary))
        def get(rep, *path):
            x = rep
            for p in path:
                x = x.get(p) if isinstance(x, dict) else None
                if x is None:
                    return None
            return x

        rows = []
        for target in ("gateway", "direct"):
            rep = out[target]
            s = get(rep, "successes") or {}
            lat = s.get("latency", {})
            ttft = get(lat, "time_to_first_token") or {}
            rows.append((target, s.get("count"), get(rep, "failures", "count"),
                         ttft.get("mean"), ttft.get("median"), ttft.get("p90"),
                         (lat.get("request_latency") or {}).get("median")))
        print("    | target | ok | failed | TTFT mean ms | TTFT p50 ms | TTFT p90 ms | "
              "latency p50 ms |")
        for row in rows:
            print("    | " + " | ".join(fmt_ms(x) if isinstance(x, float) else str(x)
                                        for x in row) + " |")
        g, dct = rows[0], rows[1]
        if g[3] is not None and dct[3] is not None:
            print(f"    gateway added TTFT: mean {fmt_ms(g[3] - dct[3])} ms, p50 "
                  f"{fmt_ms(g[4] - dct[4])} ms")
        expect(g[1] and dct[1] and not g[2] and not dct[2],
               f"both runs succeeded entirely (gateway {g[1]} ok / {g[2]} failed, direct "
               f"{dct[1]} ok / {dct[2]} failed)")

    # ------------------------------------------------------------------ check 8
    # Completions prompts and chats (string content, text-part arrays, a developer message the
    # template does not know, special-token text, unicode) that `infergate tokenize` and vLLM's
    # POST /tokenize must tokenize to the same ids.
    TOKENIZE_PROMPTS = [
        "hello world",
        "the quick brown fox jumps over the lazy dog " * 40,
        "héllo wörld — 日本語 🦀 naïve\n\ttabbed  spaces  ",
        "<|bos|>special<|end|> text <|assistant|>",
    ]
    TOKENIZE_CHATS = [
        [{"role": "user", "content": "hello world"}],
        [{"role": "system", "content": "You are brief."},
         {"role": "user", "content": "count one two three"},
         {"role": "assistant", "content": "one two three"},
         {"role": "user", "content": "now four five"}],
        [{"role": "user", "content": [{"type": "text", "text": "first part"},
                                      {"type": "text", "text": "second part"}]}],
        [{"role": "user", "content": "hi"}, {"role": "developer", "content": "be terse"}],
        [{"role": "user", "content": "日本語 🦀 «quotes»\nnew line " * 20}],
    ]

    def check_tokenize(self):
        def ours(*argv):
            r = subprocess.run([self.a.bin, "tokenize", "--tokenizer", self.model_dir, *argv],
                               capture_output=True, text=True, timeout=60)
            if r.returncode != 0:
                raise CheckFailed(f"infergate tokenize {' '.join(argv)[:80]} failed:\n"
                                  f"{r.stderr[-2000:]}")
            return json.loads(r.stdout)["tokens"]

        def theirs(body):
            r = self.http.post(self.url("A", "/tokenize"), json={"model": MODEL, **body})
            if r.status_code != 200:
                raise CheckFailed(f"vLLM /tokenize answered {r.status_code}: {r.text[:300]}")
            return r.json()["tokens"]

        def first_diff(a, b):
            return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

        diffs, n, tokens = [], 0, 0
        for prompt in self.TOKENIZE_PROMPTS:
            a, b = ours("--prompt", prompt), theirs({"prompt": prompt})
            n, tokens = n + 1, tokens + len(b)
            if a != b:
                diffs.append(f"  prompt {prompt[:40]!r}: infergate {len(a)} ids, vLLM {len(b)}, "
                             f"first difference at {first_diff(a, b)}")
        path = os.path.join(self.work, "tokenize-chat.json")
        for messages in self.TOKENIZE_CHATS:
            with open(path, "w") as f:
                json.dump({"model": MODEL, "messages": messages}, f)
            a = ours("--chat-json", path)
            b = theirs({"messages": messages, "add_generation_prompt": True})
            n, tokens = n + 1, tokens + len(b)
            if a != b:
                diffs.append(f"  chat {json.dumps(messages)[:60]}: infergate {len(a)} ids, "
                             f"vLLM {len(b)}, first difference at {first_diff(a, b)}")
        print(f"    {n} inputs, {tokens} tokens in all")
        if diffs:
            print("\n".join(diffs))
        expect(not diffs, f"infergate tokenize gives vLLM's /tokenize ids for every prompt and "
               f"chat ({len(diffs)} of {n} differ)")

    # ------------------------------------------------------------------ check 9
    def check_precise_prefix(self):
        """A gateway with precisePrefix: the instances' own KV events (BlockStored and
        BlockRemoved) decide where a repeated long prompt goes — even one this gateway never
        routed — and an eviction moves it; a request's cache_salt keeps it off another salt's
        blocks, as vLLM does, and on its own; vllm:prefix_cache_hits_total confirms the hits."""
        # Two instances of their own, publishing their KV events; stopped at the end.
        for inst, dt in self.start_fresh(("C", "D")).items():
            log(f"vLLM {inst} (KV events on) on {self.addr(inst)} healthy after {dt:.1f}s")
        port, admin = free_port(), free_port()
        eps = "\n".join(
            f"      - address: {self.addr(i)}\n        labels:\n"
            f"          infergate.io/kv-events-port: \"{self.kv_ports[i][0]}\"\n"
            f"          infergate.io/kv-events-replay-port: \"{self.kv_ports[i][1]}\""
            for i in ("C", "D"))
        cfg = f"""# written by tests/e2e/real-vllm/suite.py (check 9)
listen: {LOCAL}:{port}
admin: {LOCAL}:{admin}
reloadIntervalMs: 0
auth: none
explainHeader: true
models:
  - name: {MODEL}
    engine: vllm
    loraAdapters: [lora-a, lora-b]
    scheduler:
      preset: infergate
    precisePrefix:
      tokenizer: {self.model_dir}
    endpoints:
{eps}
"""
        path = os.path.join(self.work, "gateway-precise.yaml")
        with open(path, "w") as f:
            f.write(cfg)
        self.procs.start("gateway-precise", [self.a.bin, "gateway", "--config", path,
                                             "--workers", "1"],
                         env={"RUST_LOG": os.environ.get("REAL_VLLM_GATEWAY_LOG", "info")})
        wait_until(lambda: http_ok(f"http://{LOCAL}:{admin}/readyz"), 30, 0.2,
                   "precise gateway /readyz")

        def gw_metric(name, **match):
            text = scrape(f"http://{LOCAL}:{admin}/metrics")
            return sum(v for n, labels, v in parse_samples(text)
                       if n.endswith(name) and all(labels.get(k) == x for k, x in match.items()))

        wait_until(lambda: gw_metric("infergate_kv_events_connected_pods") == 2, 30, 0.2,
                   "both instances' KV-event feeds connected")
        # A subscriber of the suite's own beside the gateway's: what C itself publishes (part c).
        tap = KvEventTap(LOCAL, self.kv_ports["C"][0])
        try:
            self._precise_prefix_parts(port, gw_metric, tap)
        finally:
            tap.close()
        self.procs.stop("gateway-precise")
        for inst in ("C", "D"):
            self.procs.stop(f"vllm-{inst}")

    def _precise_prefix_parts(self, port, gw_metric, tap):
        gw = f"http://{LOCAL}:{port}/v1/completions"
        words = "alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima".split()
        tag = random.randrange(1 << 30)
        rng = random.Random(tag)

        def prompt(label, n_words=70):
            return f"[{label} {tag}] " + " ".join(rng.choice(words) for _ in range(n_words))

        def hits():
            return {i: metric(scrape(self.url(i, "/metrics")), "vllm:prefix_cache_hits_total")
                    for i in ("C", "D")}

        def via_gateway(p, n, **extra):
            where, explained = [], []
            for _ in range(n):
                r = self.post_explained(gw, self.completion_body(prompt=p, max_tokens=2, **extra),
                                        explained)
                expect(r.status_code == 200, f"precise gateway: {r.status_code} {r.text[:200]}")
                where.append(self.inst_of(r.headers.get("x-infergate-endpoint")))
            return where, explained

        def direct(inst, p, **extra):
            r = self.post(self.url(inst, "/v1/completions"),
                          self.completion_body(prompt=p, max_tokens=2, **extra))
            expect(r.status_code == 200, f"direct to {inst}: {r.status_code} {r.text[:200]}")
            return r.json()["usage"]["prompt_tokens"]

        # vLLM's CPU backend uses 128-token blocks: 64 of them hold 8,192 tokens.
        cfg_info = [l for n, l, _ in parse_samples(scrape(self.url("C", "/metrics")))
                    if n == "vllm:cache_config_info"]
        bs = int(cfg_info[0].get("block_size", 16)) if cfg_info else 16
        blocks = int(cfg_info[0].get("num_gpu_blocks", 64)) if cfg_info else 64

        # (a) The prompt is computed on C directly: this gateway never saw it, only C's events.
        p = prompt("precise", 130)
        stored0 = gw_metric("infergate_kv_events_blocks_total", kind="stored")
        p_tokens = direct("C", p)
        expect(p_tokens >= 3 * bs, f"the prompt has {p_tokens} tokens: 3 blocks or more")
        wait_until(lambda: gw_metric("infergate_kv_events_blocks_total", kind="stored") >= stored0 +
                   p_tokens // bs, 20, 0.1, "C's BlockStored events for the prompt")
        h0 = hits()
        where, explained = via_gateway(p, 3)
        h1 = hits()
        rose = {i: h1[i] - h0[i] for i in h0}
        want = 3 * ((p_tokens - 1) // bs) * bs
        if where.count("C") != 3:
            print("    routing decisions:\n      " + "\n      ".join(explained))
        expect(where == ["C"] * 3 and rose["C"] >= want and rose["D"] == 0,
               f"prompt of {p_tokens} tokens computed on C directly, then 3 times through the "
               f"precise gateway: served by {where}; prefix_cache_hits_total C +{rose['C']:.0f}, "
               f"D +{rose['D']:.0f} (want >= {want} on C, 0 on D)")
        expect(all("exact_prefix=2" in e for e in explained),
               f"each decision matched both pods exactly: {explained}")
        print(f"    {p_tokens}-token prompt known from C's events only: 3/3 to C, "
              f"C's prefix-cache hits +{rose['C']:.0f}")

        # (b) C evicts it: other long prompts (about 1,900 tokens each) fill C's cache.
        removed0 = gw_metric("infergate_kv_events_blocks_total", kind="removed")
        fill = 0
        for k in range(2 * blocks):
            fill += direct("C", prompt(f"filler {k}", 340)) // bs
            if fill > blocks + 4 and gw_metric("infergate_kv_events_blocks_total",
                                               kind="removed") > removed0:
                break
        wait_until(lambda: gw_metric("infergate_kv_events_blocks_total", kind="removed") > removed0,
                   20, 0.1, "C's BlockRemoved events")
        removed = gw_metric("infergate_kv_events_blocks_total", kind="removed") - removed0
        # ... and D computes it: the gateway now sends it to D.
        direct("D", p)
        time.sleep(0.5)
        h2 = hits()
        where2, explained2 = via_gateway(p, 3)
        h3 = hits()
        rose2 = {i: h3[i] - h2[i] for i in h2}
        if where2.count("D") != 3:
            print("    routing decisions:\n      " + "\n      ".join(explained2))
        expect(where2 == ["D"] * 3 and rose2["D"] >= want and rose2["C"] == 0,
               f"after C evicted the prompt ({removed:.0f} blocks removed) and D computed it: "
               f"served by {where2}; prefix_cache_hits_total C +{rose2['C']:.0f}, "
               f"D +{rose2['D']:.0f} (want >= {want} on D, 0 on C)")
        def prefix_blocks_of(explained, inst):
            for part in explained.split(" | ")[1:]:
                fields = part.split()
                if len(fields) > 1 and fields[1] == self.addr(inst):
                    for f in fields:
                        if f.startswith("prefix_blocks="):
                            return int(f.split("=")[1])
            return None

        expect(prefix_blocks_of(explained2[0], "C") == 0,
               f"after the eviction the decision credits C with none of the prompt: "
               f"{explained2[0]}")
        print(f"    C evicted {removed:.0f} blocks; the prompt followed to D: 3/3, "
              f"D's prefix-cache hits +{rose2['D']:.0f}")

        # (c) cache_salt. vLLM hashes a salted request's first block with its salt and lists the
        # salt in that block's BlockStored extra_keys, after the adapter's name under a LoRA
        # adapter (generate_block_hash_extra_keys and to_event_extra_keys in
        # vllm/v1/core/kv_cache_utils.py). A prompt salted on C directly, for the base model and
        # for lora-a: the tap shows what C published; the same prompt without the salt through
        # the gateway is credited to no pod (C would recompute it: its hits stay put), and with
        # the salt it goes to C, credited with the prompt, and hits there.
        salt = f"tenant-{tag}"
        report = []
        # The unsalted prompts of parts a and b, as C published them: no block has extra keys
        # (vLLM 0.32 sends `extra_keys` as one nil per block rather than leaving it out).
        plain = [f for _, f in tap.stored_since(0)]
        plain_keys = [k for f in plain for k in (f.get("extra_keys") or [])]
        expect(plain and all(k is None for k in plain_keys),
               f"the tap saw C's BlockStored events for parts a and b ({len(plain)} events), "
               f"none with extra keys: extra_keys {'absent' if not plain_keys else 'nil'} in "
               f"each of {sum(len(f['block_hashes']) for f in plain)} blocks")
        for label, model in (("salted", MODEL), ("salted-lora", "lora-a")):
            ps = prompt(label, 130)
            mark = tap.mark()
            stored0 = gw_metric("infergate_kv_events_blocks_total", kind="stored")
            ps_tokens = direct("C", ps, model=model, cache_salt=salt)
            n_blocks = ps_tokens // bs
            wait_until(lambda: gw_metric("infergate_kv_events_blocks_total", kind="stored") >=
                       stored0 + n_blocks, 20, 0.1,
                       f"C's BlockStored events for the {label} prompt")

            def tapped():
                evs = tap.stored_since(mark)
                return evs if sum(len(f["block_hashes"]) for _, f in evs) >= n_blocks else None

            evs = wait_until(tapped, 10, 0.1, f"the tap's copy of C's {label} BlockStored events")
            keys, names = [], set()
            for _, f in evs:
                keys += f.get("extra_keys") or [None] * len(f["block_hashes"])
                names.add(f.get("lora_name"))
            heads = [(raw, f) for raw, f in evs if f.get("parent_block_hash") is None]
            for raw, f in heads:
                shown = {k: (v if k != "token_ids" else f"[{len(v)} ids]")
                         for k, v in f.items() if k not in ("block_hashes",)}
                report.append(f"{label}: cache_salt {salt!r}, model {model}, {ps_tokens} tokens\n"
                              f"  decoded: {shown}\n"
                              f"  extra_keys, re-encoded by msgspec (vLLM's encoder): "
                              f"{tap.encode(f.get('extra_keys')).hex()}\n"
                              f"  whole batch ({len(raw)} bytes): {raw.hex()}\n")
            adapter = [] if model == MODEL else [model]
            want_keys = [adapter + [salt]] + [adapter or None] * (len(keys) - 1)
            print(f"    C published the {label} prompt's first block with extra_keys "
                  f"{keys[0] if keys else None!r}, lora_name {sorted(names, key=str)}")
            expect(len(heads) == 1 and keys[:n_blocks] == want_keys[:n_blocks]
                   and names == {None if model == MODEL else model},
                   f"{label}: C's BlockStored for {n_blocks} blocks carries extra_keys "
                   f"{keys[:3]!r}… (want {want_keys[:3]!r}…), lora_name {names}")

            h0 = hits()
            where_u, explained_u = via_gateway(ps, 1, model=model)
            h1 = hits()
            credit_u = tuple(prefix_blocks_of(explained_u[0], i) for i in ("C", "D"))
            rose_u = {i: h1[i] - h0[i] for i in h0}
            if credit_u != (0, 0):
                print("    routing decision:\n      " + explained_u[0])
            expect("exact_prefix=2" in explained_u[0] and credit_u == (0, 0)
                   and rose_u == {"C": 0, "D": 0},
                   f"{label}: the prompt without its salt through the gateway: credited C "
                   f"{credit_u[0]}, D {credit_u[1]} tokens (want 0, 0); served by {where_u}, "
                   f"prefix_cache_hits_total C +{rose_u['C']:.0f}, D +{rose_u['D']:.0f} (want 0)")

            h2 = hits()
            where_s, explained_s = via_gateway(ps, 3, model=model, cache_salt=salt)
            h3 = hits()
            rose_s = {i: h3[i] - h2[i] for i in h2}
            credit_s = [(prefix_blocks_of(e, "C"), prefix_blocks_of(e, "D")) for e in explained_s]
            held = ((ps_tokens - 1) // bs) * bs
            want_s = 3 * held
            if where_s.count("C") != 3:
                print("    routing decisions:\n      " + "\n      ".join(explained_s))
            expect(where_s == ["C"] * 3 and rose_s["C"] >= want_s and rose_s["D"] == 0
                   and all(c is not None and c >= held and d == 0 for c, d in credit_s),
                   f"{label}: with its salt, 3 times through the gateway: served by {where_s}, "
                   f"credited (C, D) {credit_s} tokens (want >= {held} on C, 0 on D); "
                   f"prefix_cache_hits_total C +{rose_s['C']:.0f}, D +{rose_s['D']:.0f} "
                   f"(want >= {want_s} on C, 0 on D)")
            print(f"    {label} ({ps_tokens} tokens, salt on C): unsalted credited to none, "
                  f"salted 3/3 to C credited {credit_s[0][0]} tokens, C's hits "
                  f"+{rose_s['C']:.0f}")
        with open(os.path.join(self.reports, "kv-events-salt.txt"), "w") as f:
            f.write("".join(report))

        expect(gw_metric("infergate_kv_events_decode_errors_total") == 0
               and gw_metric("infergate_kv_events_resets_total", reason="gap") == 0,
               "no decode error, no gap in the instances' event streams")

    # ------------------------------------------------------------------ driver
    # ------------------------------------------------------------------ check 10
    # The response object's fields, and its message's and text part's, as the emulator writes
    # them (crates/sim/src/serve/responses.rs): this check holds them against real vLLM's.
    RESPONSE_KEYS = {
        "id", "created_at", "incomplete_details", "instructions", "metadata", "model", "object",
        "output", "parallel_tool_calls", "temperature", "tool_choice", "tools", "top_p",
        "background", "max_output_tokens", "max_tool_calls", "previous_response_id", "prompt",
        "reasoning", "service_tier", "status", "text", "top_logprobs", "truncation", "usage",
        "user", "presence_penalty", "frequency_penalty", "kv_transfer_params",
        "ec_transfer_params", "input_messages", "output_messages"}
    MESSAGE_KEYS = {"id", "content", "role", "status", "type", "phase"}
    PART_KEYS = {"annotations", "text", "type", "logprobs"}
    USAGE_KEYS = {"input_tokens", "input_tokens_details", "output_tokens",
                  "output_tokens_details", "total_tokens"}
    # The emulator's event sequence, runs of deltas taken as one.
    EVENT_SEQUENCE = [
        "response.created", "response.in_progress", "response.output_item.added",
        "response.content_part.added", "response.output_text.delta", "response.output_text.done",
        "response.content_part.done", "response.output_item.done", "response.completed"]

    def check_responses(self):
        def counters():
            m = self.gw_metrics()
            return (metric(m, "infergate_gateway_ttft_seconds_count", model=MODEL),
                    metric(m, "infergate_gateway_tokens_total", model=MODEL, direction="in"),
                    metric(m, "infergate_gateway_tokens_total", model=MODEL, direction="out"))

        def wait_counted(want, what):
            try:
                wait_until(lambda: counters() == want, 10, 0.1, what)
            except Exception:  # noqa: BLE001 - say what the page held instead
                expect(False, f"{what}: gateway counted (ttft, in, out) {counters()}, want {want}")

        def shape(what, got, want):
            expect(set(got) == want, f"{what} fields: extra {sorted(set(got) - want)}, "
                   f"missing {sorted(want - set(got))}")

        ttft0, in0, out0 = counters()
        body = {"model": MODEL, "instructions": "Be brief.", "input": "count numbers",
                "max_output_tokens": 12, "ignore_eos": True, "stream": True}
        raw = b""
        with self.http.stream("POST", self.gw("/v1/responses"), json=body, timeout=60.0) as r:
            head = (r.status_code, r.headers.get("content-type"),
                    self.inst_of(r.headers.get("x-infergate-endpoint")))
            for chunk in r.iter_bytes():
                raw += chunk
        expect(head[0] == 200 and (head[1] or "").startswith("text/event-stream"),
               f"streamed: status {head[0]}, {head[1]}, served by {head[2]}")
        events = []
        for frame in raw.strip().split(b"\n\n"):
            lines = frame.split(b"\n")
            kind = next((l[7:].decode() for l in lines if l.startswith(b"event: ")), None)
            data = json.loads(next(l[6:] for l in lines if l.startswith(b"data: ")))
            events.append((kind, data))
        expect(all(k == d.get("type") and d.get("sequence_number") == i
                   for i, (k, d) in enumerate(events)),
               f"{len(events)} events, each an event: line naming its data's type, "
               f"sequence_number from 0")
        kinds = [k for i, (k, _) in enumerate(events)
                 if i == 0 or not (k == "response.output_text.delta" == events[i - 1][0])]
        deltas = sum(1 for k, _ in events if k == "response.output_text.delta")
        expect(kinds == self.EVENT_SEQUENCE and b"[DONE]" not in raw,
               f"event sequence {kinds} ({deltas} deltas), "
               f"{'a' if b'[DONE]' in raw else 'no'} [DONE]")
        done = events[-1][1]["response"]
        usage = done["usage"]
        shape("usage", usage, self.USAGE_KEYS)
        expect(usage["output_tokens"] == 12 and "cached_tokens" in usage["input_tokens_details"]
               and "reasoning_tokens" in usage["output_tokens_details"],
               f"usage: {usage['input_tokens']} in ({usage['input_tokens_details']}), "
               f"{usage['output_tokens']} out, status {done['status']}")
        wait_counted((ttft0 + 1, in0 + usage["input_tokens"], out0 + 12),
                     "streamed: first token timed, usage counted")
        # not streamed: one response object
        body["stream"] = False
        r = self.post(self.gw("/v1/responses"), body)
        expect(r.status_code == 200, f"not streamed: status {r.status_code}: {r.text[:200]}")
        v = r.json()
        shape("response", v, self.RESPONSE_KEYS)
        shape("output message", v["output"][0], self.MESSAGE_KEYS)
        shape("output text part", v["output"][0]["content"][0], self.PART_KEYS)
        expect(v["object"] == "response" and v["status"] == "incomplete"
               and (v["incomplete_details"] or {}).get("reason") == "max_output_tokens",
               f"response: object {v['object']!r}, status {v['status']!r} "
               f"({v['incomplete_details']}) at max_output_tokens with ignore_eos")
        in1 = in0 + usage["input_tokens"]
        wait_counted((ttft0 + 1, in1 + v["usage"]["input_tokens"], out0 + 24),
                     "not streamed: usage counted, no first token timed")

    CHECKS = [
        ("1", "standalone gateway + openai SDK", "check_gateway_sdk"),
        ("2", "BBR + picker over ext_proc", "check_extproc"),
        ("3", "routing on real signals", "check_routing"),
        ("5", "emulator fidelity", "check_emulator"),
        ("6", "scrape cost", "check_scrape_cost"),
        ("7", "inference-perf", "check_inference_perf"),
        ("8", "tokenization vs vLLM /tokenize", "check_tokenize"),
        ("9", "precise prefix from KV events", "check_precise_prefix"),
        ("10", "Responses API via the gateway", "check_responses"),
        ("4", "faults", "check_faults"),  # last: it kills the instances
    ]

    def run(self, selected):
        t_all = time.monotonic()
        try:
            log("setup: model, two vLLM instances, gateway")
            self.setup()
        except Exception as e:  # noqa: BLE001
            traceback.print_exc()
            print(f"real-vllm: setup failed: {e}")
            return 1
        # REAL_VLLM_REPEAT=N runs the selected checks N times on the same instances (to measure
        # how often a check holds); a check's result is its first failure, else a pass.
        repeat = max(1, int(os.environ.get("REAL_VLLM_REPEAT", "1") or "1"))
        passes = {}
        for rep in range(repeat):
            for num, title, fn in self.CHECKS:
                if selected and num not in selected:
                    continue
                if self.results.get(num, "pass") != "pass":
                    continue
                log(f"check {num}: {title}" + (f" (run {rep + 1} of {repeat})" if repeat > 1
                                               else ""))
                t0 = time.monotonic()
                try:
                    getattr(self, fn)()
                    self.results[num] = "pass"
                    passes[num] = passes.get(num, 0) + 1
                except CheckFailed as e:
                    self.results[num] = f"FAIL: {e}"
                except Exception as e:  # noqa: BLE001
                    traceback.print_exc()
                    self.results[num] = f"FAIL (error): {type(e).__name__}: {e}"
                self.timings[f"check {num}"] = time.monotonic() - t0
                log(f"check {num}: {self.results[num]} ({self.timings[f'check {num}']:.1f}s)")
        if repeat > 1:
            print("\n== repeated: " + ", ".join(
                f"check {n} passed {passes.get(n, 0)} run(s) in a row"
                + ("" if self.results[n] == "pass" else ", then failed")
                for n in sorted(self.results)))
        total = time.monotonic() - t_all
        print("\n== real-vllm summary ==")
        for num, title, _ in sorted(self.CHECKS):
            if num in self.results:
                print(f"  {num}. {title:36s} {self.timings[f'check {num}']:6.1f}s  "
                      f"{self.results[num]}")
        print(f"  setup: model {self.timings.get('model', 0):.1f}s, vLLM start "
              f"{self.timings.get('vllm start', 0):.1f}s; suite total {total:.1f}s")
        with open(os.path.join(self.reports, "summary.json"), "w") as f:
            json.dump({"results": self.results, "timings": self.timings, "total_s": total}, f,
                      indent=1)
        passed = sum(1 for v in self.results.values() if v == "pass")
        print(f"real-vllm: {passed} passed, {len(self.results) - passed} failed")
        return 0 if self.results and all(v == "pass" for v in self.results.values()) else 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--work", required=True)
    ap.add_argument("--reports", required=True)
    ap.add_argument("--perf-python", required=True)
    args = ap.parse_args()
    sel = {s.strip() for s in os.environ.get("REAL_VLLM_CHECKS", "").split(",") if s.strip()}
    suite = Suite(args)

    def on_signal(signum, _frame):
        suite.procs.stop_all()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        rc = suite.run(sel)
    finally:
        suite.procs.stop_all()
    sys.exit(rc)


if __name__ == "__main__":
    main()
