#!/usr/bin/env bash
# Builds everything from scratch and runs every test: the C++ tests (release build), the Python tests,
# and the C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
export ATTN_NUM_THREADS="${ATTN_NUM_THREADS:-2}"

rm -rf build/release build/asan
scripts/setup.sh release
ctest --preset release -j2

if [ -d tests/python ]; then
  ATTN_BIN="$PWD/build/release/attn" python3 -m pytest -q tests/python
fi

cmake --preset asan >/dev/null
cmake --build --preset asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j2
