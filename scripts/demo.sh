#!/usr/bin/env bash
# Installs what is missing, builds attn (release), and runs its main job.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh release
if ./build/release/attn demo --help >/dev/null 2>&1; then
  exec ./build/release/attn demo "$@"
fi
exec ./build/release/attn sdpa --example attn-example "$@"
