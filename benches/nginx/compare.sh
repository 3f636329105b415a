#!/usr/bin/env bash
# The standalone gateway against nginx, round-robin over the same four fast static upstreams on
# loopback, driven by the same load.
#
#   benches/nginx/compare.sh            # defaults below
#   RATE=2000 SECONDS_PER_RUN=20 CONNS=32 WRK_CONNS=64 benches/nginx/compare.sh
#
# It installs nginx and wrk with apt-get if they are missing, builds the examples of
# infergate-proxy in release mode (bench_upstream, bench_gateway, loadgen), then for each target
# (the upstream directly, nginx, the gateway):
#   1. fixed-rate latency: `loadgen URL RATE SECONDS CONNS` (open loop, p50/p90/p99);
#   2. throughput: `wrk -t2 -cWRK_CONNS -dSECONDS` with a POST body (closed loop, requests/s).
# and prints the gateway/nginx ratios, including the latency each proxy adds over the direct path.
set -euo pipefail
cd "$(dirname "$0")/../.."
RATE=${RATE:-2000}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-20}
CONNS=${CONNS:-32}
WRK_CONNS=${WRK_CONNS:-64}

need() { command -v "$1" >/dev/null 2>&1 || [ -x "/usr/sbin/$1" ]; }
if ! need nginx || ! need wrk; then
  echo "installing nginx and wrk (Debian packages)"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q nginx-light wrk >/dev/null
fi
NGINX=$(command -v nginx || echo /usr/sbin/nginx)

cargo build --release -q -p infergate-proxy --examples
BIN=target/release/examples

RUN=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$RUN"; }
trap cleanup EXIT

"$BIN/bench_upstream" 127.0.0.1:18001 127.0.0.1:18002 127.0.0.1:18003 127.0.0.1:18004 >"$RUN/upstream.log" 2>&1 &
pids+=($!)
mkdir -p "$RUN/tmp"
cp benches/nginx/nginx.conf "$RUN/nginx.conf"
"$NGINX" -p "$RUN" -c nginx.conf >"$RUN/nginx.log" 2>&1 &
pids+=($!)
RUST_LOG=warn "$BIN/bench_gateway" benches/nginx/gateway.yaml >"$RUN/gateway.log" 2>&1 &
pids+=($!)

wait_port() {
  for _ in $(seq 1 200); do
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
    sleep 0.05
  done
  echo "port $1 did not open" >&2; cat "$RUN"/*.log >&2; exit 1
}
for p in 18001 18002 18003 18004 18081 18080; do wait_port "$p"; done

cat >"$RUN/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"user","content":"Say hello."}],"max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"
LUA

field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p" <<<"$2"; }
declare -A P50 P99 RPS
for target in direct:18001 nginx:18081 gateway:18080; do
  name=${target%%:*}; port=${target##*:}
  url="http://127.0.0.1:$port/v1/chat/completions"
  lat=$("$BIN/loadgen" "$url" "$RATE" "$SECONDS_PER_RUN" "$CONNS")
  echo "$name loadgen rate=$RATE conns=$CONNS: $lat"
  P50[$name]=$(field p50_us "$lat"); P99[$name]=$(field p99_us "$lat")
  wrk_out=$(wrk -t2 -c"$WRK_CONNS" -d"${SECONDS_PER_RUN}s" -s "$RUN/post.lua" "$url")
  RPS[$name]=$(awk '/Requests\/sec/ {print $2}' <<<"$wrk_out")
  echo "$name wrk -t2 -c$WRK_CONNS: ${RPS[$name]} req/s"
done

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b > 0) printf "%.2f", a / b; else print "n/a" }'; }
added() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%d", a - b }'; }
echo
echo "| | direct | nginx | gateway | gateway / nginx |"
echo "|---|---|---|---|---|"
echo "| p50 latency at $RATE req/s (µs) | ${P50[direct]} | ${P50[nginx]} | ${P50[gateway]} | $(ratio "${P50[gateway]}" "${P50[nginx]}") |"
echo "| p99 latency at $RATE req/s (µs) | ${P99[direct]} | ${P99[nginx]} | ${P99[gateway]} | $(ratio "${P99[gateway]}" "${P99[nginx]}") |"
ng50=$(added "${P50[nginx]}" "${P50[direct]}"); gw50=$(added "${P50[gateway]}" "${P50[direct]}")
ng99=$(added "${P99[nginx]}" "${P99[direct]}"); gw99=$(added "${P99[gateway]}" "${P99[direct]}")
echo "| p50 added over direct (µs) | – | $ng50 | $gw50 | $(ratio "$gw50" "$ng50") |"
echo "| p99 added over direct (µs) | – | $ng99 | $gw99 | $(ratio "$gw99" "$ng99") |"
echo "| throughput, wrk -c$WRK_CONNS (req/s) | ${RPS[direct]} | ${RPS[nginx]} | ${RPS[gateway]} | $(ratio "${RPS[gateway]}" "${RPS[nginx]}") |"
