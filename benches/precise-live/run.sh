#!/bin/bash
# Precise prefix routing measured live: the emulated mixed fleet (crates/sim/fleets/mixed-h100-a10g.yaml,
# six vLLM pods on 8100-8101 and 8200-8203) publishing KV events on 6000 + 2i, a gateway in front on
# 8080 (admin 9090), and load.py's shared-prefix chat load; docs/precise-prefix.md, "The emulator".
#
# usage (from the repository root, after `cargo build --release`):
#   benches/precise-live/run.sh NAME precise|approx tiny|standin [RATE=8] [DURATION_S=60] [SEED=1]
# precise: the gateway with precisePrefix (the tiny tokenizer); approx: without it.
# tiny: the pods tokenize with crates/tokenizer/tests/fixtures/tiny (infergate sim --tokenizer);
# standin: with the emulator's stand-in (4 bytes a token), whose ids the gateway cannot match.
# Writes target/precise-live/NAME/ (logs, metrics pages, per-request results, summary.txt).
set -u
name=$1; mode=$2; tok=$3; rate=${4:-8}; dur=${5:-60}; seed=${6:-1}
root=$(pwd)
out=target/precise-live/$name
mkdir -p "$out"
bin=target/release/infergate
tiny=$root/crates/tokenizer/tests/fixtures/tiny
ports=(8100 8101 8200 8201 8202 8203)
{
  echo "listen: 127.0.0.1:8080"
  echo "admin: 127.0.0.1:9090"
  echo "auth: none"
  echo "explainHeader: true"
  echo "reloadIntervalMs: 0"
  echo "models:"
  echo "  - name: meta-llama/Llama-3.1-8B-Instruct"
  if [ "$mode" = precise ]; then
    echo "    precisePrefix: { tokenizer: $tiny, eventsPort: 6000, replayPort: 6001 }"
  fi
  echo "    endpoints:"
  for i in "${!ports[@]}"; do
    if [ "$mode" = precise ] && [ "$i" -gt 0 ]; then
      echo "      - address: 127.0.0.1:${ports[$i]}"
      echo "        labels: { infergate.io/kv-events-port: \"$((6000 + 2 * i))\", infergate.io/kv-events-replay-port: \"$((6001 + 2 * i))\" }"
    else
      echo "      - 127.0.0.1:${ports[$i]}"
    fi
  done
} > "$out/gateway.yaml"
extra=()
[ "$tok" = tiny ] && extra=(--tokenizer "$tiny")
$bin sim --fleet crates/sim/fleets/mixed-h100-a10g.yaml --kv-events-port 6000 "${extra[@]}" > "$out/sim.log" 2>&1 &
sim=$!
sleep 2
$bin gateway --config "$out/gateway.yaml" > "$out/gateway.log" 2>&1 &
gw=$!
for _ in $(seq 1 50); do curl -sf 127.0.0.1:9090/readyz > /dev/null && break; sleep 0.2; done
sleep 2
python3 benches/precise-live/load.py http://127.0.0.1:8080 meta-llama/Llama-3.1-8B-Instruct \
  "$rate" "$dur" "$out/results.json" "$seed" > "$out/load.txt" 2>&1
curl -s 127.0.0.1:9090/metrics > "$out/gateway-metrics.txt"
for p in "${ports[@]}"; do curl -s "127.0.0.1:$p/metrics" > "$out/pod-$p.txt"; done
kill "$gw" "$sim"
wait "$gw" "$sim" 2> /dev/null
{
  cat "$out/load.txt"
  cat "$out"/pod-*.txt | awk '
    /^vllm:prefix_cache_hits_total/ { h += $NF }
    /^vllm:prefix_cache_queries_total/ { q += $NF }
    END { printf "vllm:prefix_cache_hits_total %d of vllm:prefix_cache_queries_total %d (%.1f%%)\n", h, q, q ? 100 * h / q : 0 }'
  grep -E '^infergate_precise_prefix_requests|^infergate_kv_events_(connected_pods|blocks_total)' "$out/gateway-metrics.txt"
} | tee "$out/summary.txt"
