#!/usr/bin/env bash
# The chart's alerting rules (charts/infergate/alerts/infergate.rules.yaml) on a real Prometheus
# scraping a real `infergate gateway` in front of two `infergate sim` pods, every second:
#
#   1. every rule is evaluated without an error (`health: ok` in /api/v1/rules);
#   2. nothing is pending or firing while the install is healthy, idle and then serving;
#   3. every gateway family the rules name has series in Prometheus (a misspelt name has none);
#   4. with the pods stopped, InfergateNoRoutableEndpoint becomes pending or firing for the model.
#
#   tests/alerts/live.sh
#
# About 20 s. Environment: INFERGATE_BIN (default: cargo build -p infergate-cli,
# target/debug/infergate), ALERTS_RULES (default: the chart's rule file), ALERTS_OUT (default
# <repo>/target/alerts-live; the run's files and logs go in a new directory under it, kept on
# failure). Needs `prometheus` (Debian package `prometheus`) and python3.
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
# then the gateway's front door and admin port, and Prometheus'.
read -r SIM GW ADMIN PROM < <(python3 - <<'EOF'
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
others = [hold() for _ in range(3)]
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
EOF

"$INFERGATE_BIN" sim --fleet "$WORK/fleet.yaml" >"$WORK/sim.log" 2>&1 &
SIM_PID=$!
PIDS+=("$SIM_PID")
"$INFERGATE_BIN" gateway --config "$WORK/gateway.yaml" >"$WORK/gateway.log" 2>&1 &
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

for _ in $(seq 1 100); do
  curl -fsS "127.0.0.1:$ADMIN/readyz" >/dev/null 2>&1 && break
  sleep 0.2
done
curl -fsS "127.0.0.1:$ADMIN/readyz" >/dev/null || fail "the gateway is not ready after 20 s"

# The gateway's pods are scraped (both fresh), then every rule has been evaluated on them.
poll 30 "Prometheus scrapes the gateway's two fresh pods" '
r = get("/query?query=" + "count(infergate_pod_stale%3D%3D0)")["result"]
if not r or r[0]["value"][1] != "2": print("fresh pods:", r)'
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

# Every gateway family the rules name (the gateway's, its pods', pools' and scraper's) has
# series now: a name the gateway does not export has none.
NAMES=$(grep -oE 'infergate_(gateway|pod|pool|metrics)_[a-z_]+' "$RULES" | sort -u | tr '\n' ' ')
[ -n "$NAMES" ] || fail "no gateway family named in $RULES"
export NAMES
poll 10 "every gateway family the rules name has series in Prometheus" '
for n in os.environ["NAMES"].split():
    if not get("/query?query=count(" + n + ")")["result"]: print("no series of", n)'
poll 1 "every rule evaluated with health ok after the pods stopped" "$RULES_CHECK"
echo "alerts-live: $WANT rules healthy, none active while healthy; InfergateNoRoutableEndpoint" \
  "raised when the pods stopped; families with series: $NAMES"
