#!/usr/bin/env bash
# Builds everything from scratch and runs every test: the C++ tests (release build), the Python tests,
# the C++ tests again under AddressSanitizer + UndefinedBehaviorSanitizer (+ LeakSanitizer), the threaded
# code under ThreadSanitizer, and the fuzz harnesses.
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's own python3 marks itself externally managed (PEP 668); attn installs its few Python packages anyway.
export PIP_BREAK_SYSTEM_PACKAGES=1
export ATTN_NUM_THREADS="${ATTN_NUM_THREADS:-2}"

rm -rf build/release build/asan
scripts/setup.sh release
scripts/check_format.sh  # clang-format applies to every C++ file of src/, include/, tools/, python/csrc/, bench/, tests/
scripts/check_sizes.py  # no production file over 700 lines, no production function (C++ or Python) over 120
scripts/check_python.sh  # ruff check and ruff format --check over every .py file ([tool.ruff] in pyproject.toml)
# The release preset builds ring attention over MPI where MPI is installed (ATTN_WITH_MPI=AUTO), so this one
# run includes the mpirun tests (label mpi); where mpirun exists they must be there.
if command -v mpirun >/dev/null && [[ "$(ctest --preset release -N -L mpi)" == *"Total Tests: 0"* ]]; then
  echo "test.sh: mpirun is installed but build/release has no mpi tests (ATTN_WITH_MPI found no MPI)" >&2
  exit 1
fi
ctest --preset release -j2

# The test-only oracles (PyTorch): installed here, so the comparisons with torch run on a fresh machine.
python3 -m pip install -q --root-user-action=ignore -r scripts/requirements-test.txt

# The Python package, built by pip from these same sources (scikit-build-core + nanobind from
# scripts/requirements.txt, no build isolation: nothing is downloaded), then its tests. set -e turns any
# pytest failure into a failed run, exit code 5 ("no tests collected") included.
CMAKE_BUILD_PARALLEL_LEVEL=2 python3 -m pip install -q --no-build-isolation --root-user-action=ignore ./python
scripts/check_stubs.sh  # python/src/attn/_core/*.pyi = nanobind stubgen of the installed attn._core
# One pytest run over python/tests: the package's tests and, through ATTN_BIN (required there: a missing CLI
# fails instead of skipping), the CLI and model tests.
ATTN_BIN="$PWD/build/release/attn" python3 -m pytest -q python/tests

cmake --preset asan >/dev/null
cmake --build --preset asan
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1 ctest --preset asan -j2

# Reliability (docs/RELIABILITY.md): ThreadSanitizer over the threaded code (clang + libomp + Archer) with
# controls proving TSan and LeakSanitizer live, then each libFuzzer harness in CI mode (a fixed seed and input
# count, the same inputs on every run: see scripts/fuzz.sh) after replaying its committed regression inputs.
rm -rf build/tsan build/fuzz
scripts/sanitizers.sh
CI="${CI:-1}" scripts/fuzz.sh
