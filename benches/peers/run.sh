#!/usr/bin/env bash
# infergate side by side with other fronts: the same emulated fleet (2 H100 + 4 A10G pods serving
# Llama-3.1-8B), the same seeded streamed arrivals from the bench's own client, one report.
#
#   benches/peers/run.sh                      # 10 and 14 req/s, every front below
#   LOAD_SCALES="1" VLLM_ROUTER_POLICIES="cache_aware" benches/peers/run.sh
#
# Fronts, each in front of a fresh fleet (cold caches, nothing learned):
#   - infergate's standalone gateway with the `infergate` and `round-robin` presets (the
#     scenario's policies);
#   - vllm-router (PyPI, pinned below) with each of VLLM_ROUTER_POLICIES (benches/peers/
#     vllm-router.sh; kv_aware is given every pod's KV-event feed, which the emulated pods then
#     publish as vLLM does);
#   - nginx round-robin (benches/peers/nginx-front.sh), the data-plane floor.
# It installs what it needs: vllm-router into a venv under OUT, nginx-light with apt-get when
# missing, and builds infergate in release mode. Reports (markdown, JSON, SVG plots) go to
# OUT/reports/load-SCALE (OUT defaults to target/peers). See docs/benchmarks.md, "Against other
# fronts".
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$PWD
OUT=${OUT:-$ROOT/target/peers}
VLLM_ROUTER_VERSION=0.1.17
LOAD_SCALES=${LOAD_SCALES:-"1 1.4"}
VLLM_ROUTER_POLICIES=${VLLM_ROUTER_POLICIES:-"round_robin random power_of_two consistent_hash cache_aware kv_aware"}
SCENARIO=${SCENARIO:-benches/peers/mixed-llama-8b.yaml}
mkdir -p "$OUT"

VENV="$OUT/venv"
if [ ! -x "$VENV/bin/vllm-router" ] || ! "$VENV/bin/pip" show vllm-router 2>/dev/null | grep -qx "Version: $VLLM_ROUTER_VERSION"; then
  echo "installing vllm-router $VLLM_ROUTER_VERSION into $VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check "vllm-router==$VLLM_ROUTER_VERSION"
fi
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  echo "installing nginx-light (Debian package)"
  sudo_cmd=""; [ "$(id -u)" -ne 0 ] && sudo_cmd="sudo"
  $sudo_cmd apt-get update -q >/dev/null
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q nginx-light >/dev/null
fi

BIN=${INFERGATE_BIN:-}
if [ -z "$BIN" ]; then
  cargo build --release -q -p infergate-cli
  BIN=$ROOT/target/release/infergate
fi

export VLLM_ROUTER="$VENV/bin/vllm-router"
fronts=()
for p in $VLLM_ROUTER_POLICIES; do
  # {kv_events} is filled in by the bench for each run (see `infergate bench --help`).
  feeds=""; [ "$p" = "kv_aware" ] && feeds=" {kv_events}"
  fronts+=(--front "vllm-router-$p=$ROOT/benches/peers/vllm-router.sh $p$feeds")
done
fronts+=(--front "nginx=$ROOT/benches/peers/nginx-front.sh")

for scale in $LOAD_SCALES; do
  echo "== load scale $scale =="
  "$BIN" bench --mode live "$SCENARIO" --load-scale "$scale" --out "$OUT/reports/load-$scale" "${fronts[@]}"
done
echo "reports: $OUT/reports"
