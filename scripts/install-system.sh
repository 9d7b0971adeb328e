#!/usr/bin/env bash
# Installs the Debian packages draftfeed builds and tests with. Skips apt entirely when all are present,
# so a second run is instant and works offline.
set -euo pipefail

packages=(
  g++ clang clang-format libclang-rt-14-dev   # compilers; clang for libFuzzer and the sanitizers
  clang-tidy                                 # the static checks (.clang-tidy), with run-clang-tidy
  cmake ninja-build pkg-config
  ccache                                     # scripts/build_wheel.sh and CI compile the core once
  libgtest-dev libgmock-dev                  # the C++ test suite
  libcurl4-openssl-dev                       # the vLLM client
  libzstd-dev                                # the packed caches' lossless codec (entropy stage)
  nlohmann-json3-dev                         # JSON (safetensors headers, state.json, HTTP bodies)
  python3-dev
  libibverbs1                                # mooncake_master and the Mooncake store client
                                             # (PyPI mooncake-transfer-engine-non-cuda) link it,
                                             # even for TCP: tests/python/test_mooncake_store.py
  fuse3 libfuse3-dev                         # tools/slowfs, the slow file system of the network
                                             # file system tests and bench/bench_netfs.py
  iproute2 procps                            # ip netns / veth and sysctl: the two hosts of
                                             # tests/python/test_two_hosts.py
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "system packages: all present"
  exit 0
fi
echo "system packages: installing ${missing[*]}"
sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
