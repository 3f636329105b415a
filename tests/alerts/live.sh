#!/usr/bin/env bash
# The chart's alerting rules (charts/infergate/alerts/infergate.rules.yaml) on a real Prometheus
# scraping, every second, a real `infergate gateway` and `infergate picker` in front of two
# `infergate sim` pods, and an `infergate bbr` (body-based router) with a `--models` file:
#
#   1. every rule is evaluated without an error (`health: ok` in /api/v1/rules);
#   2. nothing is pending or firing while the install is healthy, idle and then serving;
#   3. every gateway, picker and body-based router family the rules name has series in
#      Prometheus (a misspelt name has none);
#   4. with the pods stopped, InfergateNoRoutableEndpoint becomes pending or firing for the
#      model, and InfergatePickerCannotRoute for the picker's pool once it answers a burst of
#      requests with 503 (no_fresh_endpoints); a burst of requests for a model the `--models`
#      file does not list makes InfergateBodyRouterUnknownModels pending.
#
# The picker and the router are sent ext_proc streams as Envoy opens them (request headers, then
# the body) over gRPC with `curl --http2-prior-knowledge`, the protobuf written by a few lines of
# Python below.
#
#   tests/alerts/live.sh
#
# About 30 s. Environment: INFERGATE_BIN (default: cargo build -p infergate-cli,
# target/debug/infergate), ALERTS_RULES (default: the chart's rule file), ALERTS_OUT (default
# <repo>/target/alerts-live; the run's files and logs go in a new directory under it, kept on
# failure). Needs `prometheus` (Debian package `prometheus`), python3 and a curl with HTTP/2.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../.." && pwd)"
RULES="${ALERTS_RULES:-$ROOT/charts/infergate/alerts/infergate.rules.yaml}"
fail() {
  echo "alerts-live: $*" >&2
  for f in "${WORK:-}"/*.log; do
    [ -f "$f" ] && { echo "--- $f (last lines)" >&2; tail -n 20 "$f" >&2; }
  done
  exit 1
}

command -v prometheus >/dev/null || fail "needs prometheus (apt-get install prometheus)"
command -v python3 >/dev/null || fail "needs python3"
curl -V | grep -q HTTP2 || fail "needs a curl with HTTP/2 (gRPC to the picker and the router)"
[ -f "$RULES" ] || fail "no rule file at $RULES"
RULES="$(cd "$(dirname "$RULES")" && pwd)/$(basename "$RULES")"
if [ -z "${INFERGATE_BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p infergate-cli) || fail "cargo build -p infergate-cli failed"
  INFERGATE_BIN="$ROOT/target/debug/infergate"
fi
[ -x "$INFERGATE_BIN" ] || fail "no infergate binary at $INFERGATE_BIN"

OUT="${ALERTS_OUT:-$ROOT/target/alerts-live}"
mkdir -p "$OUT"
WORK="$(mktemp -d "$OUT/run.XXXXXX")"
PIDS=()
cleanup() {
  local rc=$?
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
  if [ "$rc" -eq 0 ]; then rm -rf "$WORK"; else echo "alerts-live: files kept in $WORK" >&2; fi
}
trap cleanup EXIT

# Free loopback ports: two consecutive ones for the pods (the fleet numbers them from one port),
# then the gateway's front door and admin port, Prometheus', and the gRPC, gRPC health and
# metrics ports of the picker and of the body-based router.
read -r SIM GW ADMIN PROM PGRPC PHEALTH PMETRICS BGRPC BHEALTH BMETRICS < <(python3 - <<'EOF'
import socket
def hold(port=0):
    s = socket.socket()
    s.bind(("127.0.0.1", port))
    return s
held = []
while True:
    a = hold()
    p = a.getsockname()[1]
    try:
        b = hold(p + 1)
    except OSError:
        a.close()
        continue
    held += [a, b]
    break
others = [hold() for _ in range(9)]
print(p, *(s.getsockname()[1] for s in others))
EOF
)
MODEL=meta-llama/Llama-3.1-8B-Instruct

cat >"$WORK/fleet.yaml" <<EOF
seed: 1
pods:
  - name: a10g
    profile: llama-3.1-8b/a10g
    engine: vllm
    replicas: 2
    port: $SIM
EOF
cat >"$WORK/gateway.yaml" <<EOF
listen: 127.0.0.1:$GW
admin: 127.0.0.1:$ADMIN
auth: none
models:
  - name: $MODEL
    endpoints: [127.0.0.1:$SIM, 127.0.0.1:$((SIM + 1))]
EOF
cat >"$WORK/endpoints.yaml" <<EOF
engine: vllm
endpoints:
  - address: 127.0.0.1:$SIM
  - address: 127.0.0.1:$((SIM + 1))
EOF
ADAPTER=sql-lora
cat >"$WORK/models.yaml" <<EOF
$MODEL: [$ADAPTER]
EOF
cat >"$WORK/prometheus.yml" <<EOF
global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files:
  - $RULES
scrape_configs:
  - job_name: infergate-gateway
    static_configs:
      - targets: ["127.0.0.1:$ADMIN"]
  - job_name: infergate-picker
    static_configs:
      - targets: ["127.0.0.1:$PMETRICS"]
  - job_name: infergate-bbr
    static_configs:
      - targets: ["127.0.0.1:$BMETRICS"]
EOF
# `extproc.py BODY`: the gRPC frames of one ext_proc stream for a chat completion whose body is
# BODY, as Envoy sends them: ProcessingRequest{request_headers} (not the end of the stream),
# then ProcessingRequest{request_body} (the end). Protobuf by hand, with the field numbers of
# envoy.service.ext_proc.v3 and envoy.config.core.v3.
cat >"$WORK/extproc.py" <<'EOF'
import struct, sys
def varint(n):
    out = b""
    while True:
        b, n = n & 0x7F, n >> 7
        if not n:
            return out + bytes([b])
        out += bytes([b | 0x80])
def field(num, payload):
    return varint(num << 3 | 2) + varint(len(payload)) + payload
def flag(num, value):
    return varint(num << 3) + varint(1 if value else 0)
def header(key, value):  # HeaderMap.headers (1): HeaderValue{key (1), raw_value (3)}
    return field(1, field(1, key.encode()) + field(3, value.encode()))
def frame(msg):
    return b"\0" + struct.pack(">I", len(msg)) + msg
body = sys.argv[1].encode()
headers = b"".join(header(k, v) for k, v in [
    (":method", "POST"), (":path", "/v1/chat/completions"), (":authority", "infergate"),
    ("content-type", "application/json"), ("content-length", str(len(body)))])
# ProcessingRequest.request_headers (2): HttpHeaders{headers (1), end_of_stream (3)};
# ProcessingRequest.request_body (4): HttpBody{body (1), end_of_stream (2)}.
request_headers = field(2, field(1, headers) + flag(3, False))
request_body = field(4, field(1, body) + flag(2, True))
sys.stdout.buffer.write(frame(request_headers) + frame(request_body))
EOF
# `chat_frames MODEL FILE`: the frames of a chat completion for MODEL, into FILE.
chat_frames() {
  python3 "$WORK/extproc.py" \
    "{\"model\": \"$1\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"max_tokens\": 4}" \
    >"$2"
}
# `extproc PORT FILE`: one ext_proc stream to PORT with FILE's frames; fails unless gRPC answers.
extproc() {
  local got
  got=$(curl -sS --http2-prior-knowledge -H 'content-type: application/grpc' -H 'te: trailers' \
    --data-binary @"$2" -o /dev/null -w '%{http_code}' \
    "http://127.0.0.1:$1/envoy.service.ext_proc.v3.ExternalProcessor/Process") || got="no answer"
  [ "$got" = 200 ] || fail "ext_proc stream to 127.0.0.1:$1: $got"
}
chat_frames "$MODEL" "$WORK/model.bin"
chat_frames "$ADAPTER" "$WORK/adapter.bin"
chat_frames no-such-model "$WORK/unknown.bin"

"$INFERGATE_BIN" sim --fleet "$WORK/fleet.yaml" >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
PIDS+=("$SIM_PID")
"$INFERGATE_BIN" gateway --config "$WORK/gateway.yaml" >"$WORK/gateway.log" 2>&1 &
PIDS+=("$!")
"$INFERGATE_BIN" picker --listen-address 127.0.0.1 --pool-name llama \
  --endpoints-file "$WORK/endpoints.yaml" --grpc-port "$PGRPC" --grpc-health-port "$PHEALTH" \
  --metrics-port "$PMETRICS" >"$WORK/picker.log" 2>&1 &
PIDS+=("$!")
"$INFERGATE_BIN" bbr --listen-address 127.0.0.1 --models "$WORK/models.yaml" \
  --grpc-port "$BGRPC" --grpc-health-port "$BHEALTH" --metrics-port "$BMETRICS" \
  >"$WORK/bbr.log" 2>&1 &
PIDS+=("$!")
prometheus --config.file="$WORK/prometheus.yml" --storage.tsdb.path="$WORK/tsdb" \
  --web.listen-address="127.0.0.1:$PROM" >"$WORK/prometheus.log" 2>&1 &
PIDS+=("$!")

API="http://127.0.0.1:$PROM/api/v1"
# `poll SECONDS WHAT CHECK`: runs the Python CHECK (given `get(path)`, the JSON `data` of an API
# path) until it prints nothing and exits 0, or fails after SECONDS with its last output.
poll() {
  local within=$1 what=$2 check=$3 deadline=$((SECONDS + $1)) msg
  while :; do
    if msg=$(API="$API" python3 -c "
import json, os, sys, urllib.request
def get(path):
    with urllib.request.urlopen(os.environ['API'] + path, timeout=5) as r:
        return json.load(r)['data']
try:
$(sed 's/^/    /' <<<"$check")
except OSError as e:
    print('not answering:', e); sys.exit(1)
" 2>&1) && [ -z "$msg" ]; then
      return 0
    fi
    if [ "$SECONDS" -ge "$deadline" ]; then
      fail "$what: not within ${within}s: $msg"
    fi
    sleep 0.5
  done
}

for what in "gateway $ADMIN" "picker $PMETRICS" "body-based router $BMETRICS"; do
  port=${what##* }
  for _ in $(seq 1 100); do
    curl -fsS "127.0.0.1:$port/readyz" >/dev/null 2>&1 && break
    sleep 0.2
  done
  curl -fsS "127.0.0.1:$port/readyz" >/dev/null || fail "the ${what% *} is not ready after 20 s"
done

# The two pods are scraped fresh by the gateway and by the picker, and the router is scraped,
# then every rule has been evaluated on them.
poll 30 "Prometheus scrapes the gateway's and the picker's two fresh pods, and the router" '
r = get("/query?query=" + "count(infergate_pod_stale%3D%3D0)")["result"]
if not r or r[0]["value"][1] != "4": print("fresh pods:", r)
if not get("/query?query=" + "infergate_extproc_bbr_routed_total")["result"]: print("no router series")'
RULES_CHECK='
groups = get("/rules")["groups"]
rules = [r for g in groups for r in g["rules"]]
want = int(os.environ["WANT"])
if len(rules) != want: print(len(rules), "rules loaded, the file has", want)
for r in rules:
    if r.get("health") != "ok": print(r["name"], "health", r.get("health"), r.get("lastError"))
    elif r.get("lastEvaluation", "0001").startswith("0001"): print(r["name"], "not evaluated yet")'
WANT=$(grep -c '^ *- alert:' "$RULES")
export WANT
# Two evaluation rounds after the pods are seen, so every rule ran on their series.
sleep 2
poll 20 "every rule evaluated with health ok" "$RULES_CHECK"
NO_ALERTS='
active = [(a["labels"]["alertname"], a["state"]) for a in get("/alerts")["alerts"]]
if active: print("active while healthy:", active)'
poll 1 "no alert while healthy and idle" "$NO_ALERTS"

# Traffic: answered requests and the gateway's own 404s give the traffic families series.
for i in 1 2 3 4 5; do
  curl -fsS "127.0.0.1:$GW/v1/chat/completions" -H 'content-type: application/json' \
    -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"hi $i\"}], \"max_tokens\": 4}" \
    >/dev/null || fail "request $i to the healthy gateway failed"
  extproc "$PGRPC" "$WORK/model.bin"
  extproc "$BGRPC" "$WORK/adapter.bin"
done
sleep 3
poll 1 "no alert while healthy and serving" "$NO_ALERTS"
poll 1 "every rule still evaluated with health ok" "$RULES_CHECK"

# The pods go away: every pod stale, requests answered 503 (a rejection series appears).
kill "$SIM_PID"
wait "$SIM_PID" 2>/dev/null || true
deadline=$((SECONDS + 20))
until [ "$(curl -s -o /dev/null -w '%{http_code}' "127.0.0.1:$GW/v1/chat/completions" \
  -H 'content-type: application/json' \
  -d "{\"model\": \"$MODEL\", \"messages\": [{\"role\": \"user\", \"content\": \"hi\"}]}")" = 503 ]; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the gateway still answers for $MODEL 20 s after its pods stopped"
  sleep 0.5
done
poll 20 "InfergateNoRoutableEndpoint pending or firing for $MODEL" "
got = [(a['labels'], a['state']) for a in get('/alerts')['alerts']
       if a['labels']['alertname'] == 'InfergateNoRoutableEndpoint']
if not any(l.get('model') == '$MODEL' and l.get('job') == 'infergate-gateway'
           and l.get('severity') == 'critical' and s in ('pending', 'firing') for l, s in got):
    print('InfergateNoRoutableEndpoint:', got)"

# The picker, its pods stale too, answers 503 no_fresh_endpoints: the first answer gives the
# counter a series, then a burst (90 in a few seconds: 0.15/s over the rule's 10 minutes)
# makes InfergatePickerCannotRoute pending. The router's refusals of an unknown model, likewise.
deadline=$((SECONDS + 20))
until curl -s "127.0.0.1:$PMETRICS/metrics" \
  | grep -q 'infergate_extproc_rejections_total{.*reason="no_fresh_endpoints"'; do
  [ "$SECONDS" -lt "$deadline" ] || fail "the picker does not answer no_fresh_endpoints 20 s after its pods stopped"
  extproc "$PGRPC" "$WORK/model.bin"
  sleep 0.5
done
extproc "$BGRPC" "$WORK/unknown.bin"
sleep 2.5
for _ in $(seq 1 90); do
  extproc "$PGRPC" "$WORK/model.bin"
  extproc "$BGRPC" "$WORK/unknown.bin"
done
poll 20 "InfergatePickerCannotRoute and InfergateBodyRouterUnknownModels pending or firing" "
got = [(a['labels'], a['state']) for a in get('/alerts')['alerts']]
def active(name, **want):
    return any(l['alertname'] == name and l.get('severity') == 'warning' and s in ('pending', 'firing')
               and all(l.get(k) == v for k, v in want.items()) for l, s in got)
if not active('InfergatePickerCannotRoute', job='infergate-picker', pool='llama'):
    print('InfergatePickerCannotRoute:', [x for x in got if x[0]['alertname'] == 'InfergatePickerCannotRoute'])
if not active('InfergateBodyRouterUnknownModels', job='infergate-bbr'):
    print('InfergateBodyRouterUnknownModels:', [x for x in got if x[0]['alertname'] == 'InfergateBodyRouterUnknownModels'])"

# Every family the rules name of the gateway (its own, its pods', pools' and scraper's), the
# picker and the router has series now: a name they do not export has none.
NAMES=$(grep -oE 'infergate_(gateway|pod|pool|metrics|extproc)_[a-z_]+' "$RULES" | sort -u | tr '\n' ' ')
[ -n "$NAMES" ] || fail "no gateway, picker or router family named in $RULES"
export NAMES
poll 10 "every gateway, picker and router family the rules name has series in Prometheus" '
for n in os.environ["NAMES"].split():
    if not get("/query?query=count(" + n + ")")["result"]: print("no series of", n)'
poll 1 "every rule evaluated with health ok after the pods stopped" "$RULES_CHECK"
echo "alerts-live: $WANT rules healthy, none active while healthy; InfergateNoRoutableEndpoint" \
  "and InfergatePickerCannotRoute raised when the pods stopped, InfergateBodyRouterUnknownModels" \
  "on unknown models; families with series: $NAMES"
