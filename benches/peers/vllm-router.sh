#!/usr/bin/env bash
# vllm-router as a front of `infergate bench --mode live --front`:
#
#   vllm-router.sh POLICY                      # e.g. cache_aware
#   vllm-router.sh kv_aware {kv_events}        # the pods' KV-event feeds, filled in by the bench
#
# VLLM_ROUTER is its executable (benches/peers/run.sh installs it). The bench sets
# INFERGATE_FRONT_PORT, _AUX_PORT (its Prometheus listener) and _URLS (the pods). Each further
# argument is one pod's KV-event feed, `URL=tcp://PUB[,tcp://REPLAY]` (what the bench's
# {kv_events} gives), passed on as --kv-event-source and --kv-event-replay-source, with the
# emulated pods' block size of 16 tokens and the served model (INFERGATE_FRONT_MODEL). The
# router checks every pod's /health each second until all are up.
set -euo pipefail
: "${VLLM_ROUTER:?the vllm-router executable}"
: "${INFERGATE_FRONT_PORT:?set by infergate bench --front}"
policy=${1:?POLICY}
shift
args=(--host 127.0.0.1 --port "$INFERGATE_FRONT_PORT" --policy "$policy"
  --prometheus-host 127.0.0.1 --prometheus-port "$INFERGATE_FRONT_AUX_PORT"
  --worker-startup-check-interval 1 --log-level warning)
# shellcheck disable=SC2206 # the pods' URLs, space-separated
urls=($INFERGATE_FRONT_URLS)
args+=(--worker-urls "${urls[@]}")
if [ "$#" -gt 0 ]; then
  for feed in "$@"; do
    url=${feed%%=*}
    endpoints=${feed#*=}
    args+=(--kv-event-source "$url=${endpoints%%,*}")
    case "$endpoints" in
      *,*) args+=(--kv-event-replay-source "$url=${endpoints#*,}") ;;
    esac
  done
  args+=(--kv-event-block-size 16 --kv-event-model "${INFERGATE_FRONT_MODEL:?set by infergate bench --front}")
fi
exec "$VLLM_ROUTER" "${args[@]}"
