#!/usr/bin/env bash
# infergate side by side with other fronts: the same emulated fleet (2 H100 + 4 A10G pods serving
# Llama-3.1-8B), the same seeded streamed arrivals from the bench's own client, one report.
#
#   benches/peers/run.sh                      # 10 and 14 req/s, every front below
#   LOAD_SCALES="1" VLLM_ROUTER_POLICIES="cache_aware" benches/peers/run.sh
#   DURATION=10 LOAD_SCALES=1 VLLM_ROUTER_POLICIES=round_robin benches/peers/run.sh  # a short check
#
# Fronts, each in front of a fresh fleet (cold caches, nothing learned):
#   - infergate's standalone gateway with the `infergate` and `round-robin` presets (the
#     scenario's policies);
#   - vllm-router (PyPI, pinned below) with each of VLLM_ROUTER_POLICIES (benches/peers/
#     vllm-router.sh; kv_aware is given every pod's KV-event feed, which the emulated pods then
#     publish as vLLM does);
#   - nginx round-robin (benches/peers/nginx-front.sh), the data-plane floor.
# It installs what it needs: vllm-router into a venv under OUT, pinned with every package it pulls
# in (benches/peers/requirements.txt), nginx-light with apt-get when missing, and builds infergate
# in release mode. DURATION (seconds of arrivals) shortens every run; the figures in
# docs/benchmarks.md are from the scenario's 60 s. Reports (markdown, JSON, SVG plots) go to
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

die() { echo "benches/peers/run.sh: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 is needed to install vllm-router (Debian: apt-get install python3 python3-venv)"
python3 -c 'import ensurepip, venv' 2>/dev/null ||
  die "python3 cannot make a venv with pip (Debian: apt-get install python3-venv)"
[ -n "${INFERGATE_BIN:-}" ] || command -v cargo >/dev/null ||
  die "cargo is needed to build infergate (or set INFERGATE_BIN to a built binary)"
if [ -n "${DURATION:-}" ]; then
  # The bench refuses anything else too, but only after the installs.
  [[ "$DURATION" =~ ^[0-9]+([.][0-9]+)?$ ]] || die "DURATION must be a number of seconds, not '$DURATION'"
fi

VENV="$OUT/venv"
REQUIREMENTS="$ROOT/benches/peers/requirements.txt"
# The venv is (re)built when missing or made from another requirements file.
if [ ! -x "$VENV/bin/vllm-router" ] || ! cmp -s "$REQUIREMENTS" "$VENV/requirements.txt"; then
  echo "installing vllm-router $VLLM_ROUTER_VERSION (benches/peers/requirements.txt) into $VENV"
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet --disable-pip-version-check --no-deps -r "$REQUIREMENTS" ||
    die "pip could not install benches/peers/requirements.txt (is PyPI reachable? its output is above)"
  "$VENV/bin/pip" show vllm-router 2>/dev/null | grep -qx "Version: $VLLM_ROUTER_VERSION" ||
    die "requirements.txt does not install vllm-router $VLLM_ROUTER_VERSION"
  cp "$REQUIREMENTS" "$VENV/requirements.txt"
fi
if ! command -v nginx >/dev/null && [ ! -x /usr/sbin/nginx ]; then
  echo "installing nginx (Debian package)"
  sudo_cmd=""
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null || die "nginx is not installed, and installing it needs root or sudo (apt-get install nginx-light)"
    sudo_cmd="sudo"
  fi
  command -v apt-get >/dev/null || die "nginx is not installed and there is no apt-get: install nginx, then run again"
  $sudo_cmd apt-get update -q >/dev/null || die "apt-get update failed"
  # nginx-light where apt has it (Debian 12 does), else the nginx package: the proxy and
  # upstream modules used here are in either.
  pkg=nginx-light
  apt-cache show nginx-light >/dev/null 2>&1 || pkg=nginx
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -q "$pkg" >/dev/null ||
    die "apt-get install $pkg failed"
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
  duration=(); [ -n "${DURATION:-}" ] && duration=(--duration "$DURATION")
  "$BIN" bench --mode live "$SCENARIO" --load-scale "$scale" "${duration[@]}" \
    --out "$OUT/reports/load-$scale" "${fronts[@]}"
done
echo "reports: $OUT/reports"
