#!/usr/bin/env bash
# Builds every fuzz target and runs each for FUZZ_SECONDS (default 60) from its committed seeds
# (seeds/<target>/) plus the corpus it has grown so far (corpus/<target>/, not committed).
# A crash, a hang (over 10 s on one input) or running out of memory (2 GiB) fails the run and
# prints the input's path under artifacts/<target>/. `.ci/run` runs this; docs/testing.md
# ("Fuzzing") explains it.
#
#   fuzz/run.sh                      # every target, 60 s each
#   FUZZ_SECONDS=600 fuzz/run.sh extproc_picker extproc_bbr
#
# Targets run FUZZ_JOBS at a time (default: one per CPU; each libFuzzer run uses one core), so
# each still gets its FUZZ_SECONDS of a core while the whole step takes a fraction of the sum.
#
# Needs cargo-fuzz. On a stable toolchain RUSTC_BOOTSTRAP=1 lets rustc take the -Z flags
# cargo-fuzz passes. Sanitizer `none` (no ASan: the crates have no `unsafe`) with debug assertions
# on, so an arithmetic overflow is a crash too.
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
# The fuzz build has flags of its own: it keeps its own target dir (fuzz/target, or
# FUZZ_TARGET_DIR), even when CARGO_TARGET_DIR points the workspace's builds elsewhere.
export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/target}"
secs="${FUZZ_SECONDS:-60}"
jobs="${FUZZ_JOBS:-$(nproc)}"
case "$jobs" in ''|*[!0-9]*|0) echo "FUZZ_JOBS must be a whole number of at least 1, not '$jobs'" >&2; exit 2 ;; esac
flags=(--sanitizer none --debug-assertions)

if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

start=$(date +%s)
# Every target at once (cargo fuzz build takes one name or none); a no-op when built. The runs
# below start the built binaries themselves, so nothing is rebuilt between two targets.
cargo fuzz build "${flags[@]}"
bin="$CARGO_TARGET_DIR/$(rustc -vV | sed -n 's/^host: //p')/release"
built=$(date +%s)
echo "fuzz targets built in $((built - start)) s"

mkdir -p ../target/fuzz-logs

# One target's run; its outcome goes to its .status file for the summary.
fuzz_one() {
  local t=$1 log="../target/fuzz-logs/$1.log" status
  echo "-- $t: ${secs} s from seeds/$t"
  if "$bin/$t" -artifact_prefix="artifacts/$t/" -max_total_time="$secs" -max_len=65536 \
    -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 "corpus/$t" "seeds/$t" >"$log" 2>&1; then
    status=ok
  else
    status=FAILED
    {
      echo "################ fuzz target $t FAILED ################"
      grep -E 'panicked at|ERROR: libFuzzer|SUMMARY' "$log" | head -5 || true
      artifact=$(grep -o 'Test unit written to [^ ]*' "$log" | awk '{print $5}' | tail -1 || true)
      echo "input: fuzz/$artifact (replay: cd fuzz && RUSTC_BOOTSTRAP=1 cargo fuzz run -s none -a $t $artifact)"
      echo "log: target/fuzz-logs/$t.log"
    } >&2
  fi
  echo "$status" >"../target/fuzz-logs/$t.status"
}

for t in "${targets[@]}"; do
  mkdir -p "corpus/$t" "artifacts/$t"
  rm -f "../target/fuzz-logs/$t.status"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do
    wait -n || true
  done
  fuzz_one "$t" &
done
wait

failed=()
summary=()
for t in "${targets[@]}"; do
  log="../target/fuzz-logs/$t.log"
  status=$(cat "../target/fuzz-logs/$t.status" 2>/dev/null || echo FAILED)
  [ "$status" = ok ] || failed+=("$t")
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | awk '{print $2}' | tail -1 || true)
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | awk '{print $2}' | tail -1 || true)
  units=$(find "corpus/$t" -type f | wc -l)
  summary+=("$(printf '%-18s %-7s %12s runs %8s exec/s %6s corpus' "$t" "$status" "${runs:-?}" "${rate:-?}" "$units")")
done
end=$(date +%s)

printf '%s\n' "${summary[@]}"
echo "fuzzing took $((end - start)) s (build $((built - start)) s, ${#targets[@]} targets x ${secs} s, ${jobs} at a time)"
if [ "${#failed[@]}" -gt 0 ]; then
  echo "fuzz targets failed: ${failed[*]}" >&2
  exit 1
fi
