#!/usr/bin/env bash
# Fails when a C++ file of the library, the CLI, the bindings, the benchmarks or the tests differs
# from what clang-format (.clang-format at the root; comments are not reflowed) makes of it. Fix with
# the same file list and -i. The Python files have their own check: scripts/check_python.sh (ruff).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files 'src/*.cc' 'src/*.h' 'include/*.h' 'tools/*.cc' 'tools/*.h' \
  'python/csrc/*.cc' 'python/csrc/*.h' 'python/csrc_torch/*.cc' 'bench/*.cc' 'bench/*.h' 'tests/*.cc' 'tests/*.h')
if ! clang-format --dry-run --Werror "${files[@]}"; then
  echo "check_format: the files above differ from clang-format; run: clang-format -i <file>" >&2
  exit 1
fi
echo "check_format: ${#files[@]} files match clang-format"
