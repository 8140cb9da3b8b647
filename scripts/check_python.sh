#!/usr/bin/env bash
# Fails when a Python file of the repository (every *.py git knows, tracked or new and not ignored:
# the package python/src/attn, its tests, bench/, scripts/, tests/) has a ruff finding or differs
# from what ruff's formatter makes of it. The rules and the line length are [tool.ruff] in
# pyproject.toml; ruff is in scripts/requirements.txt. The stubs (*.pyi) are generated:
# scripts/check_stubs.sh checks them. Fix with: ruff format <file> && ruff check --fix <file>, then
# by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
files=()
while IFS= read -r -d '' f; do
  # A file deleted but not yet committed is still in the index.
  if [[ -f "$f" ]]; then files+=("$f"); fi
done < <(git ls-files --cached --others --exclude-standard -z '*.py')
if ! ruff check --quiet "${files[@]}"; then
  echo "check_python: ruff check found the problems above" >&2
  exit 1
fi
if ! ruff format --check --quiet "${files[@]}"; then
  echo "check_python: the files above differ from ruff format; run: ruff format <file>" >&2
  exit 1
fi
echo "check_python: ${#files[@]} Python files pass ruff check and match ruff format"
