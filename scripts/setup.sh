#!/usr/bin/env bash
# Installs what attn needs on Debian 12 that is not there yet (apt and pip), then configures and builds.
# Usage: scripts/setup.sh [preset]   (default preset: release)
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian's own python3 marks itself externally managed (PEP 668); attn installs its few Python packages anyway.
export PIP_BREAK_SYSTEM_PACKAGES=1
preset="${1:-release}"

apt_packages=(cmake ninja-build g++ clang clang-format libclang-rt-14-dev libomp-14-dev pkg-config libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev libfmt-dev nlohmann-json3-dev libicu-dev librandom123-dev libcairo2-dev libopenblas-openmp-dev libdnnl-dev libhwy-dev
  python3 python3-pip
  libopenmpi-dev openmpi-bin  # ring attention over MPI (built into the release preset: ATTN_WITH_MPI=AUTO)
  chromium fonts-dejavu-core)  # the report's headless-browser test; the font the heatmaps are drawn in
missing=()
for p in "${apt_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=""
  [ "$(id -u)" -eq 0 ] || sudo_cmd="sudo"
  $sudo_cmd apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo_cmd apt-get install -y -qq "${missing[@]}" >/dev/null
fi

python3 -m pip install -q -r scripts/requirements.txt 2>&1 | grep -v "Running pip as the 'root' user" || true

cmake --preset "$preset" >/dev/null
cmake --build --preset "$preset"
