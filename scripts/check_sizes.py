#!/usr/bin/env python3
"""Fails when a production file is over 700 lines or a production function is over 120 lines.

Production files: those git knows (tracked, or new and not ignored) under src/, include/, tools/,
python/csrc/ and python/src/ (the Python package, its generated stubs included). Functions: those of
the C++ files among them (.cc, .h, .cpp, .hpp) and of the package's Python modules (.py). Function
extents come from lizard (scripts/requirements.txt), which parses C++ without the headers, and Python;
a length runs from the line of the signature to the closing brace (C++) or to the last line of the
body (Python, docstring included). Each offender is named with its size. Usage:
scripts/check_sizes.py [--max-file-lines N] [--max-function-lines N] (defaults 700 and 120: the
limits of issue 17, "One source of truth", on every production file since issue 47).
"""

import argparse
import os
import subprocess
import sys

import lizard

FILE_ROOTS = ["src", "include", "tools", "python/csrc", "python/csrc_torch", "python/src"]
FUNCTION_ROOTS = FILE_ROOTS
FUNCTION_SUFFIXES = (".cc", ".h", ".cpp", ".hpp", ".py")  # C++, and Python (not the .pyi stubs)

# Offenders whose owners are splitting them (issues 17, 47): reported as pending, not failed on.
# Delete an entry in the commit that fixes it (an entry that no longer offends is reported as
# stale); the list only shrinks and is meant to end empty.
PENDING_FUNCTIONS = set()
PENDING_FILES = set()


def listed_files(roots):
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z", "--", *roots],
        check=True,
        capture_output=True,
    ).stdout
    paths = sorted({p for p in out.decode().split("\0") if p})
    # A deleted file stays in the index until committed; links (the extension module) are not source.
    return [p for p in paths if os.path.isfile(p) and not os.path.islink(p)]


def line_count(path):
    with open(path, "rb") as f:
        data = f.read()
    if b"\0" in data:
        return None  # binary
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-file-lines", type=int, default=700)
    ap.add_argument("--max-function-lines", type=int, default=120)
    args = ap.parse_args()
    os.chdir(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

    failures, pending, seen_pending = [], [], set()

    files = listed_files(FILE_ROOTS)
    for path in files:
        n = line_count(path)
        if n is not None and n > args.max_file_lines:
            msg = f"{path}: {n} lines (limit {args.max_file_lines})"
            if path in PENDING_FILES:
                pending.append(msg)
                seen_pending.add(path)
            else:
                failures.append(msg)

    sources = [p for p in listed_files(FUNCTION_ROOTS) if p.endswith(FUNCTION_SUFFIXES)]
    n_functions = 0
    for path in sources:
        for fn in lizard.analyze_file(path).function_list:
            n_functions += 1
            if fn.length <= args.max_function_lines:
                continue
            msg = (
                f"{path}:{fn.start_line}: {fn.name} has {fn.length} lines "
                f"(lines {fn.start_line}-{fn.end_line}, limit {args.max_function_lines})"
            )
            if (path, fn.name) in PENDING_FUNCTIONS:
                pending.append(msg)
                seen_pending.add((path, fn.name))
            else:
                failures.append(msg)

    # Not a failure: several people split these at once, and one who fixes an entry must not turn CI red.
    stale = [
        entry
        for entry in sorted(PENDING_FILES | PENDING_FUNCTIONS, key=str)
        if entry not in seen_pending
    ]

    for msg in pending:
        print(f"check_sizes: pending: {msg}")
    for entry in stale:
        print(
            f"check_sizes: stale: {entry} is within the limits now: delete it from PENDING in "
            "scripts/check_sizes.py"
        )
    for msg in failures:
        print(f"check_sizes: {msg}", file=sys.stderr)
    if failures:
        print(
            f"check_sizes: {len(failures)} offender(s) above: split them (files <= "
            f"{args.max_file_lines} lines, functions <= {args.max_function_lines})",
            file=sys.stderr,
        )
        return 1
    print(
        f"check_sizes: {len(files)} files <= {args.max_file_lines} lines, {n_functions} functions "
        f"in {len(sources)} C++ and Python files <= {args.max_function_lines} lines"
        + (f" ({len(pending)} pending)" if pending else "")
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
