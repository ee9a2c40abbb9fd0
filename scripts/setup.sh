#!/usr/bin/env bash
# Installs every Debian package the build, the tests, the examples and the perf charts need, if any is missing. Run as
# root.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config python3 python3-matplotlib
  libtbb-dev libboost-dev doctest-dev
  libdnnl-dev zlib1g-dev libcli11-dev nlohmann-json3-dev libfmt-dev
  openmpi-bin libopenmpi-dev
  libtorch-dev libopenblas0-pthread
  python3-dev python3-torch pybind11-dev python3-pybind11 python3-pytest
  dataset-fashion-mnist
  clang libclang-rt-14-dev xz-utils
  iproute2 iputils-ping iptables nftables libnetfilter-queue-dev util-linux
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update
  apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup: all ${#packages[@]} packages present"
fi

if [ ! -x /usr/local/cuda/bin/nvcc ] && ! command -v nvcc >/dev/null; then
  echo "setup: no CUDA toolkit at /usr/local/cuda: the build goes on without the CUDA backend (STEALBATCH_CUDA=OFF)"
fi
