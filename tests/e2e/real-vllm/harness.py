"""Process, port, HTTP and Prometheus helpers for the real-vLLM suite (stdlib + httpx; the KV-event
tap also pyzmq and msgspec, which vLLM itself depends on)."""
import os
import re
import signal
import subprocess
import sys
import threading
import time

import httpx

from util import LOCAL, free_port, log  # noqa: F401 (re-exported: suite.py uses harness.log)


class CheckFailed(AssertionError):
    pass


def expect(cond, what):
    """One assertion: prints what was measured, raises when it does not hold."""
    print(f"    {'ok  ' if cond else 'FAIL'} {what}", flush=True)
    if not cond:
        raise CheckFailed(what)


class Procs:
    """Every process the suite starts, each in its own session (process group), so a stop takes
    its children too (vLLM forks an engine core and a worker). Group ids are also written to
    PIDFILE so run.sh's trap can kill what a crashed suite left behind."""

    def __init__(self, logdir, pidfile):
        self.logdir = logdir
        self.pidfile = pidfile
        self.procs = {}
        self.log_starts = {}
        os.makedirs(logdir, exist_ok=True)

    def _write_pids(self):
        with open(self.pidfile, "w") as f:
            for p in self.procs.values():
                f.write(f"{p.pid}\n")

    def start(self, name, argv, env=None, cwd=None):
        logf = open(os.path.join(self.logdir, f"{name}.log"), "ab")
        # tail() shows this start's output only, not an earlier process's of the same name.
        self.log_starts[name] = logf.seek(0, os.SEEK_END)
        full_env = dict(os.environ)
        full_env.update(env or {})
        p = subprocess.Popen(argv, stdout=logf, stderr=subprocess.STDOUT, env=full_env,
                             cwd=cwd, start_new_session=True)
        logf.close()
        self.procs[name] = p
        self._write_pids()
        return p

    def alive(self, name):
        p = self.procs.get(name)
        return p is not None and p.poll() is None

    def stop(self, name, sig=signal.SIGTERM, timeout=15):
        p = self.procs.pop(name, None)
        if p is None:
            return
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(10)
        # vLLM's engine core and worker are in the same group; make sure none outlives it.
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._write_pids()

    def stop_all(self):
        for name in list(self.procs):
            self.stop(name, timeout=10)

    def tail(self, name, n=30):
        path = os.path.join(self.logdir, f"{name}.log")
        try:
            with open(path, "rb") as f:
                f.seek(self.log_starts.get(name, 0))
                lines = f.read().decode(errors="replace").splitlines()
            return "\n".join(lines[-n:])
        except OSError:
            return ""


def wait_until(fn, timeout, interval=0.5, what="condition"):
    """Poll fn() until it returns a truthy value or timeout seconds pass (bounded)."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # noqa: BLE001 - a poll target that is not up yet
            last = e
        time.sleep(interval)
    raise CheckFailed(f"timed out after {timeout}s waiting for {what} (last: {last!r})")


def http_ok(url, timeout=2.0):
    try:
        return httpx.get(url, timeout=timeout).status_code == 200
    except httpx.HTTPError:
        return False


# ---------------------------------------------------------------- Prometheus text format

_SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})?\s+(\S+)')
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_samples(text):
    """[(name, {label: value}, float)] for every sample line."""
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if not m:
            continue
        labels = dict(_LABEL.findall(m.group(3) or ""))
        try:
            v = float(m.group(4))
        except ValueError:
            continue
        out.append((m.group(1), labels, v))
    return out


def parse_families(text):
    """{family: {"type": str, "labels": frozenset}} from # TYPE lines and the samples under them.
    Label names are the union over the family's samples, without histogram `le` and summary
    `quantile`."""
    fams = {}
    types = {}
    for line in text.splitlines():
        if line.startswith("# TYPE "):
            _, _, name, typ = line.split(None, 3)
            types[name] = typ.strip()
            fams.setdefault(name, {"type": typ.strip(), "labels": set()})
    suffixes = ("_bucket", "_count", "_sum", "_total", "_created", "_info")
    for name, labels, _ in parse_samples(text):
        fam = name if name in types else None
        if fam is None:
            for s in suffixes:
                if name.endswith(s) and name[: -len(s)] in types:
                    fam = name[: -len(s)]
                    break
        if fam is None:
            fams.setdefault(name, {"type": "untyped", "labels": set()})
            fam = name
        fams[fam]["labels"].update(k for k in labels if k not in ("le", "quantile"))
    return {k: {"type": v["type"], "labels": frozenset(v["labels"])} for k, v in fams.items()}


def metric(text, name, **match):
    """Sum of the samples called `name` whose labels include `match`."""
    total = 0.0
    for n, labels, v in parse_samples(text):
        if n == name and all(labels.get(k) == val for k, val in match.items()):
            total += v
    return total


def scrape(url, timeout=5.0):
    return httpx.get(url, timeout=timeout).text


def lora_state(metrics_text):
    """vLLM's vllm:lora_requests_info: the series with the newest timestamp value gives the
    current running and waiting adapters; also every adapter named in any series."""
    best = None
    seen = set()
    for n, labels, v in parse_samples(metrics_text):
        if n != "vllm:lora_requests_info":
            continue
        for k in ("running_lora_adapters", "waiting_lora_adapters"):
            seen.update(a for a in labels.get(k, "").split(",") if a)
        if best is None or v > best[0]:
            best = (v, labels)
    running = set()
    if best:
        running = {a for a in best[1].get("running_lora_adapters", "").split(",") if a}
    return running, seen


def fmt_ms(x):
    return f"{x * 1000:.1f}"


def pct(values, q):
    if not values:
        return float("nan")
    v = sorted(values)
    k = min(len(v) - 1, max(0, int(round(q / 100 * (len(v) - 1)))))
    return v[k]


class KvEventTap:
    """A second subscriber to one vLLM instance's KV-event publisher (ZeroMQ PUB, the frames
    `(topic, 8-byte big-endian sequence, payload)` of `vllm/distributed/kv_events.py`), kept
    beside the gateway's: it records every batch as it came and decoded untyped, so a check can
    show what vLLM itself published. A batch is msgspec's array form of `KVEventBatch`,
    `[ts, [event, ...], data_parallel_rank]`; each event is a map tagged by `type` (vLLM 0.32:
    `{"type": "BlockStored", "block_hashes": …, "extra_keys": …}`, fields at their default
    left out) or, in releases that encode events as arrays, positional with the tag first
    (`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium,
    lora_name, extra_keys, …]`)."""

    def __init__(self, host, port):
        import msgspec
        import zmq
        self._decode = msgspec.msgpack.decode
        self.encode = msgspec.msgpack.encode  # for showing a decoded part as the bytes it was
        self._ctx = zmq.Context()
        self._sock = self._ctx.socket(zmq.SUB)
        self._sock.setsockopt(zmq.SUBSCRIBE, b"")
        self._sock.setsockopt(zmq.RCVTIMEO, 200)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.connect(f"tcp://{host}:{port}")
        self._again = zmq.Again
        self._lock = threading.Lock()
        self._batches = []  # (seq, raw payload, decoded)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                frames = self._sock.recv_multipart()
            except self._again:
                continue
            if len(frames) != 3:
                continue
            _topic, seq, payload = frames
            try:
                decoded = self._decode(payload)
            except Exception as e:  # noqa: BLE001 - kept, shown by whoever reads it
                decoded = {"undecodable": repr(e)}
            with self._lock:
                self._batches.append((int.from_bytes(seq, "big"), payload, decoded))

    def mark(self):
        """The position after every batch received so far (for `since`)."""
        with self._lock:
            return len(self._batches)

    def since(self, mark):
        """[(seq, raw payload, decoded batch)] received after `mark`."""
        with self._lock:
            return list(self._batches[mark:])

    def stored_since(self, mark):
        """[(raw payload, event)] for every BlockStored event after `mark`, the event as a dict
        of vLLM's field names (those the event carries)."""
        out = []
        for _seq, raw, batch in self.since(mark):
            if not isinstance(batch, list) or len(batch) < 2:
                continue
            for ev in batch[1]:
                f = block_stored_fields(ev)
                if f is not None:
                    out.append((raw, f))
        return out

    def close(self):
        self._stop.set()
        self._thread.join(2)
        self._sock.close(0)
        self._ctx.term()


def block_stored_fields(ev):
    """A decoded BlockStored event, keyed or positional, as a dict of vLLM's field names (those
    it carries); None for any other event."""
    if isinstance(ev, dict):
        return {k: v for k, v in ev.items() if k != "type"} if ev.get("type") == "BlockStored" \
            else None
    if isinstance(ev, list) and ev and ev[0] == "BlockStored":
        names = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                 "medium", "lora_name", "extra_keys", "group_idx")
        return dict(zip(names, ev[1:]))
    return None


def die(msg):
    print(f"real-vllm: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)
