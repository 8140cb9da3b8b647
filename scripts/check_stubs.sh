#!/usr/bin/env bash
# Fails when the type stubs of attn._core (python/src/attn/_core/*.pyi: the module and its submodules nn,
# models, viz) differ from what nanobind's stubgen makes of the built extension. The stubs are generated,
# never edited: types and docstrings live in the bindings (nb::sig, docstrings in python/csrc/*.cc), the
# imports the signatures need in scripts/check_stubs.patterns. Needs an importable attn._core: the pip-installed
# package (scripts/test.sh), or the dev build with PYTHONPATH=python/src. stubgen's output follows nanobind's
# version (scripts/requirements.txt pins it): the committed ones are nanobind 3.1.0's (written_by below); a
# failure under another version says so.
#   scripts/check_stubs.sh            check
#   scripts/check_stubs.sh --write    regenerate python/src/attn/_core/*.pyi in place
set -euo pipefail
cd "$(dirname "$0")/.."
stubs=python/src/attn/_core
written_by=3.1.0  # the nanobind whose stubgen wrote the committed stubs; update it with them
generate() {  # $1: the folder that receives _core/
  python3 -m nanobind.stubgen -q -m attn._core -r -O "$1" -p scripts/check_stubs.patterns
}
if [[ "${1:-}" == "--write" ]]; then
  rm -rf "$stubs"/*.pyi
  generate python/src/attn
  echo "check_stubs: wrote $(ls "$stubs"/*.pyi | tr '\n' ' ')"
  exit 0
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
generate "$tmp"
if ! diff -ru "$stubs" "$tmp/_core"; then
  core="$(python3 -c 'import attn._core; print(attn._core.__file__)')"
  nb="$(python3 -c 'import nanobind; print(nanobind.__version__)')"
  echo "check_stubs: $stubs differs from nanobind $nb stubgen of $core (diff above: - committed, + generated);" \
    "after changing the bindings run: PYTHONPATH=python/src scripts/check_stubs.sh --write" >&2
  if [[ "$nb" != "$written_by" ]]; then
    echo "check_stubs: the committed stubs were written by nanobind $written_by, this is $nb: install" \
      "nanobind==$written_by, or regenerate with $nb and set written_by in scripts/check_stubs.sh" >&2
  fi
  exit 1
fi
echo "check_stubs: $(ls "$stubs"/*.pyi | wc -l) stub files match the bindings"
