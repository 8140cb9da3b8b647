#!/usr/bin/env bash
# The core layer as a user gets it: installs the build tree (BUILD) into WORK/prefix, builds
# tests/consumer/src against it with find_package(attn COMPONENTS core) (linking attn::core alone), runs
# the program (one attention call checked against a double softmax), and fails if the program's shared
# libraries include any of the upper layers' dependencies: Cairo, ICU, oneDNN, a BLAS or MPI.
# Usage: check.sh BUILD WORK CXX [CXX_FLAGS [LINKER_FLAGS]]
set -euo pipefail
build="$1" work="$2" cxx="$3" cxx_flags="${4:-}" ld_flags="${5:-}"
here="$(cd "$(dirname "$0")" && pwd)"
rm -rf "$work"
cmake --install "$build" --prefix "$work/prefix" >/dev/null
cmake -S "$here/src" -B "$work/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$work/prefix" -DCMAKE_CXX_FLAGS="$cxx_flags" -DCMAKE_EXE_LINKER_FLAGS="$ld_flags" \
  >"$work/configure.log" 2>&1 || { cat "$work/configure.log" >&2; exit 1; }
cmake --build "$work/build" >"$work/build.log" 2>&1 || { cat "$work/build.log" >&2; exit 1; }
"$work/build/core_consumer"
libs="$(ldd "$work/build/core_consumer")"
echo "$libs"
if grep -iE 'cairo|icu|dnnl|blas|mpi' <<<"$libs"; then
  echo "check.sh: a program linking attn::core alone loads the libraries above" >&2
  exit 1
fi
echo "check.sh: attn::core links none of Cairo, ICU, oneDNN, BLAS, MPI"
