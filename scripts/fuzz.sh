#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz: clang, AddressSanitizer + UBSan, coverage over the whole attn
# library) and runs each one for a bounded time, after replaying every committed regression input.
#
# Usage: scripts/fuzz.sh [harness...]        (default: every harness that was built)
# Env:   ATTN_FUZZ_SECONDS   fuzzing time per harness (default 60)
#        ATTN_FUZZ_BUILD_DIR build folder (default build/fuzz)
# A crash, leak, timeout or broken invariant leaves its input under <build>/artifacts/<harness>/ and makes the
# script fail; commit that input under tests/fuzz/regressions/<harness>/ with the fix (see the README there).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${ATTN_FUZZ_SECONDS:-60}"
build="${ATTN_FUZZ_BUILD_DIR:-build/fuzz}"
cxx="${ATTN_FUZZ_CXX:-clang++}"

# Warnings are not errors here: the GCC release build enforces them, clang's set differs.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DATTN_BUILD_FUZZ=ON -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_BENCH=OFF -DATTN_WERROR=OFF >/dev/null
cmake --build "$build" -j2

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for bin in "$build"/tests/fuzz/fuzz_*; do harnesses+=("$(basename "$bin" | sed 's/^fuzz_//')"); done
fi

mkdir -p "$build/tmp"
export TMPDIR="$PWD/$build/tmp"  # the reader harnesses write their input to a scratch file
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ATTN_NUM_THREADS=2
failed=()
for h in "${harnesses[@]}"; do
  bin="$build/tests/fuzz/fuzz_$h"
  [ -x "$bin" ] || { echo "fuzz: no harness $h" >&2; exit 2; }
  max_len=4096
  [ "$h" = attention ] && max_len=256
  # The readers get at most 4 KiB files: an allocation beyond 64 MiB means a size was trusted.
  limits=(-malloc_limit_mb=64 -rss_limit_mb=2048 -timeout=20 -max_len="$max_len")
  work="$build/corpus/$h"
  artifacts="$build/artifacts/$h"
  mkdir -p "$work" "$artifacts"

  regressions=(tests/fuzz/regressions/"$h"/*)
  if [ -e "${regressions[0]}" ]; then
    echo "fuzz: $h: replaying ${#regressions[@]} regression inputs"
    "$bin" "${limits[@]}" "${regressions[@]}" >"$build/$h.replay.log" 2>&1 ||
      { tail -30 "$build/$h.replay.log"; failed+=("$h (regression replay)"); continue; }
  fi
  echo "fuzz: $h: ${seconds}s"
  if "$bin" "${limits[@]}" -max_total_time="$seconds" -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$work" "tests/fuzz/corpus/$h" >"$build/$h.log" 2>&1; then
    grep -E "stat::number_of_executed_units|stat::peak_rss_mb" "$build/$h.log" | tr '\n' ' '
    echo "corpus $(ls "$work" | wc -l) files"
  else
    tail -40 "$build/$h.log"
    failed+=("$h (see $artifacts)")
  fi
done
rm -rf "$build/tmp"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all harnesses clean"
