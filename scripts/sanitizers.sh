#!/usr/bin/env bash
# ThreadSanitizer over attn's threaded code, plus positive controls showing that TSan and LeakSanitizer are
# live (a known race and a known leak must be reported). The whole suite under ASan + UBSan + LSan is the
# asan preset run of scripts/test.sh. Why clang + libomp + Archer: docs/RELIABILITY.md.
#
# Usage: scripts/sanitizers.sh   Env: ATTN_TSAN_BUILD_DIR (default build/tsan)
set -euo pipefail
cd "$(dirname "$0")/.."
build="${ATTN_TSAN_BUILD_DIR:-build/tsan}"
cxx="${ATTN_TSAN_CXX:-clang++}"
tsan_flags="-fsanitize=thread -g -fno-omit-frame-pointer"

# Archer (LLVM's OMPT tool, in Debian's libomp-14-dev) tells TSan about libomp's barriers, task queues and
# locks; without it every parallel region's fork/join looks like a race.
llvm_lib="$(dirname "$(readlink -f "$(command -v "$cxx")")")/../lib"
archer="$llvm_lib/libarcher.so"
[ -f "$archer" ] || { echo "sanitizers: libarcher.so not found next to $cxx (install libomp-14-dev)" >&2; exit 2; }

cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_CXX_FLAGS="$tsan_flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=thread" \
  -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=thread" -DATTN_BUILD_TOOLS=OFF -DATTN_BUILD_BENCH=OFF \
  -DATTN_WERROR=OFF -DATTN_LIBRARY_OPT=-O1 >/dev/null
targets=(attn_reliability_tests)
[ -d tests/cpu ] && targets+=(attn_cpu_tests)
cmake --build "$build" -j2 --target "${targets[@]}"

export OMP_TOOL_LIBRARIES="$archer"
# ignore_noninstrumented_modules: libomp's own (uninstrumented) spin-waits are not races of ours; Archer
# supplies the happens-before edges they imply.
export TSAN_OPTIONS="ignore_noninstrumented_modules=1 halt_on_error=1 exitcode=66 second_deadlock_stack=1 allocator_may_return_null=1"

# Control 1: a race inside attn::parallel_for (every task increments one int) must be reported. (The
# tasks sleep so that every worker runs some: TSan reports races it sees happen, not ones that could.)
mkdir -p "$build/controls"
cat >"$build/controls/race.cc" <<'CC'
#include <chrono>
#include <thread>

#include "core/parallel.h"
int main() {
  int counter = 0;
  attn::parallel_for(32, 4, [&](int64_t, int) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // every worker gets tasks
    counter = counter + 1;
  });
  return counter == 0;
}
CC
$cxx -std=c++20 $tsan_flags -fopenmp -Iinclude -Isrc "$build/controls/race.cc" "$build/src/libattn_core.a" -lfmt \
  -o "$build/controls/race"
if "$build/controls/race" >"$build/controls/race.log" 2>&1; then
  echo "sanitizers: ThreadSanitizer missed the race in the control program" >&2
  exit 1
fi
grep -q "WARNING: ThreadSanitizer: data race" "$build/controls/race.log" ||
  { cat "$build/controls/race.log" >&2; exit 1; }
echo "sanitizers: TSan control race reported (as it must be)"

# Control 2: LeakSanitizer (inside the GCC AddressSanitizer runtime the asan preset uses) reports a leak.
printf '#include <cstdlib>\nint main() { void* volatile p = std::malloc(77); p = nullptr; return p != nullptr; }\n' \
  >"$build/controls/leak.cc"
g++ -fsanitize=address -g "$build/controls/leak.cc" -o "$build/controls/leak"
if ASAN_OPTIONS=detect_leaks=1 "$build/controls/leak" >"$build/controls/leak.log" 2>&1 ||
  ! grep -q "LeakSanitizer: detected memory leaks" "$build/controls/leak.log"; then
  echo "sanitizers: LeakSanitizer missed the leak in the control program" >&2
  exit 1
fi
echo "sanitizers: LSan control leak reported (as it must be)"

# The threaded code under TSan: the determinism tests run both backends' forward and backward at 1, 2, 3
# and 7 threads, the attention fuzz corpus runs random problems at 1 to 7 threads, and the cpu tests every
# kernel path; 4 threads on 2 cores interleave them. (The other reliability tests are single-threaded
# checks of values, run by the release and asan builds.)
export ATTN_NUM_THREADS=4
"$build/tests/attn_reliability_tests" --gtest_brief=1 --gtest_filter='*Determinism*:FuzzReplay.Attention'
if [ -x "$build/tests/attn_cpu_tests" ]; then
  "$build/tests/attn_cpu_tests" --gtest_brief=1
fi
echo "sanitizers: ThreadSanitizer clean"
