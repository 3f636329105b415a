#!/usr/bin/env bash
# The gateway's user-space instructions per request, counted by valgrind's callgrind: a cost
# figure that other load on the machine does not disturb, for before/after comparisons.
#
#   benches/nginx/callgrind.sh            # builds the examples, one gateway worker
#   BIN=DIR benches/nginx/callgrind.sh    # prebuilt bench_upstream, bench_gateway, loadgen in DIR
#   WORKERS=2 benches/nginx/callgrind.sh
#   CONFIG=FILE benches/nginx/callgrind.sh   # another gateway.yaml (the same ports), e.g. with
#                                            # accessLog: on
#
# It starts the four static upstreams of compare.sh and `bench_gateway` under callgrind with
# instrumentation off, warms up with 200 requests, then counts the instructions of every thread
# of the gateway (workers, control plane, scrapers) while `loadgen` sends 2,000 requests (500
# req/s for 3 s plus its 1 s warm-up, 4 connections), and prints the count per request, and the
# calls to the C allocator (malloc, calloc, realloc, posix_memalign: Rust's allocations) per
# request.
# Kernel time is not counted. The callgrind profile is kept as OUT (default
# target/callgrind.gateway.out) for `callgrind_annotate`.
set -euo pipefail
cd "$(dirname "$0")/../.."
# Every port this script serves must be free: a wait for a port that another program already
# holds would succeed at once, and the run would measure that program.
for p in 18001 18002 18003 18004 18080 18090; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
    echo "port $p on 127.0.0.1 is in use (another gateway or benchmark?): stop it first" >&2
    exit 1
  fi
done
WORKERS=${WORKERS:-1}
OUT=${OUT:-target/callgrind.gateway.out}
CONFIG=${CONFIG:-benches/nginx/gateway.yaml}
command -v valgrind >/dev/null || { echo "valgrind is needed (apt-get install valgrind)" >&2; exit 1; }
if [ -z "${BIN:-}" ]; then
  cargo build --release -q -p infergate-proxy --examples
  BIN=target/release/examples
fi
rm -f "$OUT" "$OUT".*
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap cleanup EXIT
"$BIN/bench_upstream" 127.0.0.1:18001 127.0.0.1:18002 127.0.0.1:18003 127.0.0.1:18004 >/dev/null 2>&1 &
pids+=($!)
RUST_LOG=warn valgrind --tool=callgrind --callgrind-out-file="$OUT" --instr-atstart=no \
  "$BIN/bench_gateway" "$CONFIG" "$WORKERS" >/dev/null 2>&1 &
gw=$!
pids+=("$gw")
for _ in $(seq 1 300); do
  (exec 3<>/dev/tcp/127.0.0.1/18080) 2>/dev/null && break
  sleep 0.2
done
url=http://127.0.0.1:18080/v1/chat/completions
"$BIN/loadgen" "$url" 100 1 4 >/dev/null
callgrind_control -i on "$gw" >/dev/null
"$BIN/loadgen" "$url" 500 3 4 >/dev/null
callgrind_control -i off "$gw" >/dev/null
callgrind_control -d "$gw" >/dev/null
sleep 1
# The dump of the instrumented phase is the largest file.
profile=$(ls -S "$OUT"* | head -1)
total=$(callgrind_annotate "$profile" 2>/dev/null | awk '/PROGRAM TOTALS/ { gsub(",", "", $1); print $1 }')
echo "gateway instructions per request: $((total / 2000)) (workers=$WORKERS, profile $profile)"
# Calls to the allocator: the `calls=` line after each `cfn=` naming one (names are given once,
# as `(id) name`, then by id alone).
allocs=$(awk '
  match($0, /^c?fn=\([0-9]+\)/) {
    id = substr($0, RSTART, RLENGTH); sub(/^c?fn=/, "", id)
    rest = substr($0, RLENGTH + 2)
    if (rest != "") name[id] = rest
    if ($0 ~ /^cfn=/) callee = name[id]
    next
  }
  /^calls=/ {
    if (callee == "malloc" || callee == "calloc" || callee == "realloc" || callee == "posix_memalign") {
      split($0, a, /[= ]/); n[callee] += a[2]
    }
    callee = ""
  }
  END { printf "%d %d %d %d", n["malloc"], n["calloc"], n["realloc"], n["posix_memalign"] }
' "$profile")
read -r malloc calloc realloc memalign <<<"$allocs"
awk -v m="$malloc" -v c="$calloc" -v r="$realloc" -v p="$memalign" 'BEGIN {
  printf "allocator calls per request: %.2f (malloc %.2f, calloc %.2f, realloc %.2f, posix_memalign %.2f)\n",
    (m + c + r + p) / 2000, m / 2000, c / 2000, r / 2000, p / 2000 }'
