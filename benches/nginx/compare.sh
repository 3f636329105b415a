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
# and prints the gateway/nginx ratios, including the latency each proxy adds over the direct path,
# and the CPU time each proxy spends per request (user + system, all threads and worker
# processes, from /proc/PID/stat) during each phase: a figure that other load on the machine
# disturbs much less than latency; under wrk also split into user space and kernel.
#
# BIN=DIR runs prebuilt bench_upstream, bench_gateway and loadgen from DIR instead of building
# them (to compare two builds with the same script); GATEWAY_ARGS are extra arguments of
# bench_gateway (for example the number of workers).
set -euo pipefail
cd "$(dirname "$0")/../.."
# Every port this script serves must be free: a wait for a port that another program already
# holds would succeed at once, and the run would measure that program.
for p in 18001 18002 18003 18004 18080 18081 18090; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p on 127.0.0.1 is in use (another gateway or benchmark?): stop it first" >&2
    exit 1
  fi
done
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

if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p infergate-proxy --examples
  BIN=target/release/examples
fi
GATEWAY_ARGS=${GATEWAY_ARGS:-}

RUN=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; rm -rf "$RUN"; }
trap cleanup EXIT

"$BIN/bench_upstream" 127.0.0.1:18001 127.0.0.1:18002 127.0.0.1:18003 127.0.0.1:18004 >"$RUN/upstream.log" 2>&1 &
pids+=($!)
mkdir -p "$RUN/tmp"
cp benches/nginx/nginx.conf "$RUN/nginx.conf"
"$NGINX" -p "$RUN" -c nginx.conf >"$RUN/nginx.log" 2>&1 &
nginx_pid=$!
pids+=("$nginx_pid")
# shellcheck disable=SC2086 # GATEWAY_ARGS is a list of words
RUST_LOG=warn "$BIN/bench_gateway" benches/nginx/gateway.yaml $GATEWAY_ARGS >"$RUN/gateway.log" 2>&1 &
gateway_pid=$!
pids+=("$gateway_pid")

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
# CPU clock ticks of a process and its worker processes (nginx forks them): "user system".
procs_of() { echo "$1"; cat /proc/[0-9]*/stat 2>/dev/null | awk -v p="$1" '$4 == p {print $1}'; }
cpu_split() {
  local user=0 sys=0 u s
  for p in $(procs_of "$1"); do
    read -r u s < <(awk '{print $14, $15}' "/proc/$p/stat" 2>/dev/null) || continue
    user=$((user + ${u:-0})); sys=$((sys + ${s:-0}))
  done
  echo "$user $sys"
}
# User + system.
cpu_ticks() { local u s; read -r u s < <(cpu_split "$1"); echo $((u + s)); }
HZ=$(getconf CLK_TCK)
us_per_req() { awk -v t="$1" -v hz="$HZ" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t / hz * 1e6 / n; else print "n/a" }'; }
# Every request loadgen sends, its one-second warm-up included (the CPU counters see those too).
LOADGEN_REQS=$(awk -v r="$RATE" -v s="$SECONDS_PER_RUN" 'BEGIN { printf "%d", r * (s + 1) }')
declare -A P50 P99 RPS CPU_LAT CPU_WRK USR_WRK SYS_WRK
for target in direct:18001 nginx:18081 gateway:18080; do
  name=${target%%:*}; port=${target##*:}
  case $name in nginx) pid=$nginx_pid ;; gateway) pid=$gateway_pid ;; *) pid= ;; esac
  url="http://127.0.0.1:$port/v1/chat/completions"
  [ -n "$pid" ] && c0=$(cpu_ticks "$pid")
  lat=$("$BIN/loadgen" "$url" "$RATE" "$SECONDS_PER_RUN" "$CONNS")
  [ -n "$pid" ] && CPU_LAT[$name]=$(us_per_req $(($(cpu_ticks "$pid") - c0)) "$LOADGEN_REQS")
  echo "$name loadgen rate=$RATE conns=$CONNS: $lat cpu_us_per_req=${CPU_LAT[$name]:-}"
  P50[$name]=$(field p50_us "$lat"); P99[$name]=$(field p99_us "$lat")
  [ -n "$pid" ] && read -r u0 s0 < <(cpu_split "$pid")
  wrk_out=$(wrk -t2 -c"$WRK_CONNS" -d"${SECONDS_PER_RUN}s" -s "$RUN/post.lua" "$url")
  n=$(awk '/requests in/ {print $1}' <<<"$wrk_out")
  if [ -n "$pid" ]; then
    read -r u1 s1 < <(cpu_split "$pid")
    CPU_WRK[$name]=$(us_per_req $((u1 - u0 + s1 - s0)) "$n")
    USR_WRK[$name]=$(us_per_req $((u1 - u0)) "$n")
    SYS_WRK[$name]=$(us_per_req $((s1 - s0)) "$n")
  fi
  RPS[$name]=$(awk '/Requests\/sec/ {print $2}' <<<"$wrk_out")
  echo "$name wrk -t2 -c$WRK_CONNS: ${RPS[$name]} req/s cpu_us_per_req=${CPU_WRK[$name]:-}"
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
echo "| proxy CPU per request at $RATE req/s (µs) | – | ${CPU_LAT[nginx]} | ${CPU_LAT[gateway]} | $(ratio "${CPU_LAT[gateway]}" "${CPU_LAT[nginx]}") |"
echo "| proxy CPU per request under wrk (µs) | – | ${CPU_WRK[nginx]} | ${CPU_WRK[gateway]} | $(ratio "${CPU_WRK[gateway]}" "${CPU_WRK[nginx]}") |"
echo "| of which user space (µs) | – | ${USR_WRK[nginx]} | ${USR_WRK[gateway]} | $(ratio "${USR_WRK[gateway]}" "${USR_WRK[nginx]}") |"
echo "| of which kernel (µs) | – | ${SYS_WRK[nginx]} | ${SYS_WRK[gateway]} | $(ratio "${SYS_WRK[gateway]}" "${SYS_WRK[nginx]}") |"
echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"
