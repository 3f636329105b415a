#!/usr/bin/env bash
# Instructions per request on the picker's threads, under valgrind's callgrind: a measure of the
# picker's CPU cost that does not depend on what else the machine runs (wall-clock CPU time
# does). Runs the load example at a low rate (valgrind slows everything some 50x), then reads the
# per-thread profiles and counts the threads that serve ext_proc streams. Metric scrapes are not
# request work: where they run on those threads (older trees), their tasks' instructions are
# subtracted (their share of the runtime's timer and I/O driver is not, so such a figure is a
# little high); where the scraper has a thread of its own, that thread is not counted.
#
#   crates/extproc/examples/load-callgrind.sh [RPS=20] [SECONDS=10] [extra load arguments...]
#
# LOAD_BIN=<path> profiles that load binary instead of building this tree's (e.g. one built from
# an older commit, for a before/after comparison). KEEP=<dir> keeps the per-thread profiles and
# their annotations there (for `callgrind_annotate --tree=caller`, say).
set -euo pipefail
rps=${1:-20}
seconds=${2:-10}
shift $(( $# > 2 ? 2 : $# ))
cd "$(dirname "$0")/../../.."
bin=${LOAD_BIN:-target/release/examples/load}
if [ -z "${LOAD_BIN:-}" ]; then
    cargo build --release -q -p infergate-extproc --example load
fi
dir=$(mktemp -d)
trap '[ -n "${KEEP:-}" ] && cp -r "$dir" "$KEEP"; rm -rf "$dir"' EXIT
valgrind --tool=callgrind --separate-threads=yes --callgrind-out-file="$dir/cg.%p" \
    "$bin" --rps "$rps" --seconds "$seconds" "$@" >"$dir/out.txt" 2>/dev/null
n=$(grep -oP 'completed \K[0-9]+' "$dir/out.txt")
# Inclusive instructions of the first function whose name contains $2, in annotated profile $1.
inclusive() { { grep -F "$2" "$1" || true; } | head -1 | awk '{gsub(",", "", $1); print $1 + 0}'; }
picker=0 subtracted=0 profiles=()
for f in "$dir"/cg.*; do
    callgrind_annotate --inclusive=yes "$f" >"$f.txt" 2>/dev/null || continue
    total=$({ grep -m1 "^summary" "$f" || echo "summary 0"; } | awk "{print \$2}")
    s=$(inclusive "$f.txt" 'scraper::run_target::{{closure}} [')
    if grep -q 'ExternalProcessorServer' "$f.txt"; then
        picker=$((picker + total - ${s:-0}))
        subtracted=$((subtracted + ${s:-0}))
        profiles+=("$f.txt")
    fi
done
echo "requests: $n at $rps req/s for $seconds s ($*)"
echo "picker instructions per request: $((picker / n))"
echo "scrape task instructions subtracted from those threads (whole run): $subtracted"
echo "per request, inclusive (parts overlap: the stream task contains the exchange):"
for part in \
    'H2Stream<F,B,Ex> as core::future::future::Future>::poll [|HTTP/2 stream tasks (service, answers, encoding)' \
    '<hyper::server::conn::http2::Connection<I,S,E> as core::future::future::Future>::poll [|HTTP/2 connection task (frames, HPACK, socket reads and writes)' \
    'PickerExchange<P>::route_body [|routing at the end of the body (parse, pick, answer)' \
    'ProstDecoder<U> as tonic::codec::Decoder>::decode [|protobuf decoding of Envoy messages'; do
    pattern=${part%%|*}
    sum=0
    for t in "${profiles[@]}"; do
        v=$(inclusive "$t" "$pattern")
        sum=$((sum + ${v:-0}))
    done
    printf '  %8d  %s\n' $((sum / n)) "${part#*|}"
done
