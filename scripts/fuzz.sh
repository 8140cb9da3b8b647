#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz: clang, AddressSanitizer + UBSan, coverage over the whole attn
# library), replays every committed regression input through them, then fuzzes each harness in one of two modes:
#
#   CI mode (replay)  when CI is set (and not "0" or "false"; scripts/test.sh sets it when unset) or
#                     ATTN_FUZZ_RUNS is given. Each harness runs with a fixed -seed and a fixed -runs count from
#                     a fresh working corpus (only the committed seeds in tests/fuzz/corpus/<harness>), without
#                     corpus reloads, address-space randomisation or OpenMP threads, in a fixed environment; the
#                     inputs it kept are then replayed once with threads on. The same code in the same
#                     checkout path executes the same inputs on every run, so CI passes or fails on the code,
#                     never on luck (the saved input of a failure reproduces anywhere). The default counts
#                     take about 4 minutes for the four harnesses on the 2-core dev machine.
#   Exploration       otherwise: each harness runs ATTN_FUZZ_SECONDS with a random seed (printed, so a run can
#                     be repeated) and threads on, and keeps its working corpus in <build>/corpus/<harness>
#                     between runs. Use it to look for new bugs; it explores different inputs every time.
# docs/RELIABILITY.md ("Fuzzing: CI mode and exploration") says why CI mode needs each of these measures.
#
# Usage: scripts/fuzz.sh [harness...]        (default: every harness that was built)
# Env:   CI                  set: CI mode (see above)
#        ATTN_FUZZ_RUNS      CI mode with this many inputs per harness (default per harness: ci_runs below)
#        ATTN_FUZZ_SEED      libFuzzer -seed (CI mode default 1; exploration default random)
#        ATTN_FUZZ_SECONDS   exploration time per harness (default 60)
#        ATTN_FUZZ_BUILD_DIR build folder (default build/fuzz)
# A crash, leak, timeout or broken invariant leaves its input under <build>/artifacts/<harness>/ and makes the
# script fail; commit that input under tests/fuzz/regressions/<harness>/ with the fix (see the README there).
# Reproduce one input: <build>/tests/fuzz/fuzz_<harness> <file> (no harness keeps state between inputs).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${ATTN_FUZZ_SECONDS:-60}"
build="${ATTN_FUZZ_BUILD_DIR:-build/fuzz}"
case "$build" in /*) ;; *) build="$PWD/$build" ;; esac
cxx="${ATTN_FUZZ_CXX:-clang++}"

ci_mode=0
case "${CI:-}" in "" | 0 | false | False | FALSE) ;; *) ci_mode=1 ;; esac
[ -n "${ATTN_FUZZ_RUNS:-}" ] && ci_mode=1
# CI mode: inputs per harness, sized from the measured rates so that each takes about one minute (attention
# is slow per input: two backends, forward + backward, two thread counts).
declare -A ci_runs=([attention]=30000 [npy]=260000 [safetensors]=200000 [checkpoint]=30000 [packed]=100000)

# Warnings are not errors here: the GCC release build enforces them, clang's set differs.
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DATTN_BUILD_FUZZ=ON -DATTN_BUILD_TESTS=OFF -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_BENCH=OFF -DATTN_WERROR=OFF >/dev/null
cmake --build "$build" -j2

harnesses=("$@")
if [ ${#harnesses[@]} -eq 0 ]; then
  for bin in "$build"/tests/fuzz/fuzz_*; do harnesses+=("$(basename "$bin" | sed 's/^fuzz_//')"); done
fi

mkdir -p "$build/tmp"
export TMPDIR="$build/tmp"  # the reader harnesses write their input to a scratch file
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:symbolize=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
export ATTN_NUM_THREADS=2
no_aslr=""
if [ "$ci_mode" = 1 ]; then
  if setarch "$(uname -m)" -R true 2>/dev/null; then
    no_aslr=setarch
  else
    echo "fuzz: warning: cannot turn off address-space randomisation (setarch -R): CI mode runs the same seeds" \
      "and counts, but the mutated inputs may differ between runs" >&2
  fi
fi
failed=()
for h in "${harnesses[@]}"; do
  bin="$build/tests/fuzz/fuzz_$h"
  [ -x "$bin" ] || { echo "fuzz: no harness $h" >&2; exit 2; }
  max_len=4096
  [ "$h" = attention ] && max_len=256
  # The readers get at most 4 KiB files: an allocation beyond 64 MiB means a size was trusted.
  limits=(-malloc_limit_mb=64 -rss_limit_mb=2048 -timeout=20 -max_len="$max_len")
  artifacts="$build/artifacts/$h"
  mkdir -p "$artifacts"

  regressions=(tests/fuzz/regressions/"$h"/*)
  if [ -e "${regressions[0]}" ]; then
    echo "fuzz: $h: replaying ${#regressions[@]} regression inputs"
    "$bin" "${limits[@]}" "${regressions[@]}" >"$build/$h.replay.log" 2>&1 ||
      { tail -30 "$build/$h.replay.log"; failed+=("$h (regression replay)"); continue; }
  fi

  if [ "$ci_mode" = 1 ]; then
    runs="${ATTN_FUZZ_RUNS:-${ci_runs[$h]:-20000}}"
    seed="${ATTN_FUZZ_SEED:-1}"
    # A fresh working corpus: what earlier runs found must not change which inputs this run tries.
    work="$build/ci-corpus/$h"
    rm -rf "$work"
    mode=(-seed="$seed" -runs="$runs" -reload=0)
    echo "fuzz: $h: CI mode, -seed=$seed -runs=$runs"
    # The same seed is not enough: values that reach the comparisons libFuzzer traces (and so the mutations it
    # derives from them) include addresses, which move with address-space randomisation and, on the stack,
    # with the size of the environment and of the arguments. So: no ASLR, a fixed environment, and paths
    # relative to the repository root.
    # And one OpenMP thread: coverage is counted over all threads, and which worker runs which task (dynamic
    # schedule) changes the edges hit, so multithreaded inputs steer the mutations differently on every run.
    # The inputs found are then replayed with threads on (below), which checks the thread-count invariants.
    # The readers' scratch files: a fixed, empty folder (a process id in the path reaches error messages and
    # so the traced comparisons; files left by an earlier run change the first input's coverage).
    scratch="$(realpath -m --relative-to=. "$TMPDIR/scratch_$h")"
    rm -rf "$scratch"
    replayer=(env -i PATH=/usr/local/bin:/usr/bin:/bin ASAN_OPTIONS="$ASAN_OPTIONS" UBSAN_OPTIONS="$UBSAN_OPTIONS"
      ATTN_NUM_THREADS="$ATTN_NUM_THREADS" TMPDIR="$(realpath -m --relative-to=. "$TMPDIR")"
      ATTN_FUZZ_SCRATCH="$scratch")
    runner=("${replayer[@]}" OMP_THREAD_LIMIT=1)
    if [ -n "$no_aslr" ]; then runner+=("$no_aslr" "$(uname -m)" -R); fi
    bin="$(realpath -m --relative-to=. "$bin")"
    work="$(realpath -m --relative-to=. "$work")"
    artifacts="$(realpath -m --relative-to=. "$artifacts")"
  else
    work="$build/corpus/$h"
    runner=()
    replayer=()
    mode=(-max_total_time="$seconds")
    [ -n "${ATTN_FUZZ_SEED:-}" ] && mode+=(-seed="$ATTN_FUZZ_SEED")
    echo "fuzz: $h: exploring for ${seconds}s"
  fi
  mkdir -p "$work"
  start=$SECONDS
  if "${runner[@]}" "$bin" "${limits[@]}" "${mode[@]}" -print_final_stats=1 -artifact_prefix="$artifacts/" \
      "$work" "tests/fuzz/corpus/$h" >"$build/$h.log" 2>&1; then
    # "#runs DONE cov: .. ft: .. corp: .." is the same on every CI-mode run of the same code.
    echo "fuzz: $h: $(grep -m1 -o 'Seed: [0-9]*' "$build/$h.log"), $((SECONDS - start)) s:" \
      "$(grep -E '^#[0-9]+[[:space:]]+DONE' "$build/$h.log" | sed -E 's/[[:space:]]+lim:.*//; s/[[:space:]]+/ /g')," \
      "peak RSS $(grep -o 'stat::peak_rss_mb: *[0-9]*' "$build/$h.log" | grep -o '[0-9]*$') MB"
    if [ "$ci_mode" = 1 ]; then
      # -runs=0: execute every input of the corpus once, no mutation.
      echo "fuzz: $h: replaying the $(ls "$work" | wc -l) inputs found and the seeds with OpenMP threads on"
      "${replayer[@]}" "$bin" "${limits[@]}" -runs=0 -artifact_prefix="$artifacts/" "$work" "tests/fuzz/corpus/$h" \
        >"$build/$h.threads.log" 2>&1 ||
        { tail -40 "$build/$h.threads.log"; failed+=("$h (threaded replay, see $artifacts)"); }
    fi
  else
    tail -40 "$build/$h.log"
    echo "fuzz: $h: $(grep -m1 -o 'Seed: [0-9]*' "$build/$h.log"); the input is in $artifacts" >&2
    failed+=("$h (see $artifacts)")
  fi
done
rm -rf "$build/tmp"
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "fuzz: all harnesses clean"
