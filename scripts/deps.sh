#!/usr/bin/env bash
# Installs every Debian package kvtier needs to build, test and benchmark. Idempotent: when all
# packages are present it only runs dpkg-query (well under a second) and touches nothing.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config git
  libgtest-dev libgmock-dev libbenchmark-dev
  liburing-dev librocksdb-dev liblz4-dev libxxhash-dev libssl-dev
  nlohmann-json3-dev libspdlog-dev libfmt-dev libcli11-dev libcpp-httplib-dev
  libvulkan-dev glslang-tools spirv-tools mesa-vulkan-drivers vulkan-tools vulkan-validationlayers
  clang libclang-rt-14-dev
  fio python3 python3-matplotlib util-linux e2fsprogs
  pybind11-dev python3-dev libdlpack-dev python3-torch python3-numpy python3-pytest
  redis-server redis-tools
  libzmq3-dev libmsgpack-cxx-dev python3-zmq python3-msgpack jq
  prometheus
)

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
  [[ "$status" == "install ok installed" ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  # A glslang for the cooperative-matrix-2 kernels: the distribution's when >= 15.1, else Debian
  # 13's source built once into a cache (minutes, the first time only; see the script).
  "$(dirname "$0")/glslang.sh" >/dev/null
  exit 0
fi

echo "deps.sh: installing ${missing[*]}"
sudo_cmd=()
[[ $(id -u) -ne 0 ]] && sudo_cmd=(sudo)
export DEBIAN_FRONTEND=noninteractive
"${sudo_cmd[@]}" apt-get update -qq
"${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
"$(dirname "$0")/glslang.sh" >/dev/null
echo "deps.sh: done"
