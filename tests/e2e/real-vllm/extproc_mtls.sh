#!/usr/bin/env bash
# Mutual TLS on the picker's ext_proc port from an independent client (grpcio and the
# envoy-data-plane messages of extproc_client.py), against the real binary in front of an emulated
# pod: no vLLM, about 5 s once installed. See extproc_mtls.py and docs/extproc.md, "Mutual TLS".
#
#   tests/e2e/real-vllm/extproc_mtls.sh
#
# Environment: REAL_VLLM_CACHE (default <repo>/target/real-vllm; the venv goes in its
# mtls-venv, reinstalled when a pin or the Python changes), REAL_VLLM_OUT (default
# <repo>/target/real-vllm; certificates and logs go in its extproc-mtls), INFERGATE_BIN (default:
# cargo build -p infergate-cli, target/debug/infergate), EXTPROC_MTLS_PYTHON (default python3).
set -euo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/../../.." && pwd)"
CACHE="${REAL_VLLM_CACHE:-$ROOT/target/real-vllm}"
mkdir -p "$CACHE"
CACHE="$(cd "$CACHE" && pwd)"
OUT="${REAL_VLLM_OUT:-$ROOT/target/real-vllm}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)/extproc-mtls"
PY="${EXTPROC_MTLS_PYTHON:-python3}"
VENV="$CACHE/mtls-venv"
fail() { echo "extproc-mtls: $*" >&2; exit 1; }

command -v openssl >/dev/null || fail "needs openssl (it makes the certificates)"
# The suite's own pins, so both clients are the same versions.
PINS="$(grep -E '^(grpcio|envoy-data-plane)==' "$HERE/requirements.txt" | tr '\n' ' ')"
[ -n "$PINS" ] || fail "no grpcio/envoy-data-plane pins in $HERE/requirements.txt"
STAMP="$({ "$PY" -c 'import sys; print(sys.version)'; echo "$PINS"; } | sha256sum | cut -c1-16)"
if [ "$(cat "$VENV/.stamp" 2>/dev/null)" != "$STAMP" ]; then
  echo "extproc-mtls: installing $PINS into $VENV"
  rm -rf "$VENV"
  "$PY" -m venv "$VENV" || fail "could not create a venv with $PY"
  # shellcheck disable=SC2086 # one word per pin
  "$VENV/bin/pip" install -q --disable-pip-version-check $PINS \
    || fail "pip install $PINS failed (is PyPI reachable?)"
  echo "$STAMP" > "$VENV/.stamp"
fi

if [ -z "${INFERGATE_BIN:-}" ]; then
  (cd "$ROOT" && cargo build -q -p infergate-cli) || fail "cargo build -p infergate-cli failed"
  INFERGATE_BIN="$ROOT/target/debug/infergate"
fi
[ -x "$INFERGATE_BIN" ] || fail "no infergate binary at $INFERGATE_BIN"
INFERGATE_BIN="$(cd "$(dirname "$INFERGATE_BIN")" && pwd)/$(basename "$INFERGATE_BIN")"

exec "$VENV/bin/python" -u "$HERE/extproc_mtls.py" --bin "$INFERGATE_BIN" --work "$OUT"
