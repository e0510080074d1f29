#!/usr/bin/env bash
# Install the Debian packages orochi builds and tests with. Idempotent: packages already present
# are skipped, so CI and developers can run it every time.
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git
  libzmq3-dev libprotobuf-c-dev protobuf-c-compiler libmicrohttpd-dev libcjson-dev libxxhash-dev
  libcmocka-dev clang libclang-rt-14-dev
  python3 python3-numpy python3-regex python3-matplotlib python3-pip python3-jinja2 python3-jsonschema unzip
  libopenblas0-pthread haproxy iproute2
)
# libopenblas0-pthread: numpy's matrix products through OpenBLAS instead of the reference BLAS,
# which makes tools/train_medusa.py about 12 times faster (docs/medusa.md); haproxy and iproute2:
# deploy/orochi-balance and its test (two groups in network namespaces, integration_balancer)

SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

# the packages among the arguments that are not installed
not_installed() {
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || echo "$p"
  done
}

mapfile -t missing < <(not_installed "${PACKAGES[@]}")
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#PACKAGES[@]} packages present"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# The official OpenAI Python client (PyPI; Debian has no package of it) for the
# integration_openai_client test. A failure is not fatal: that test then skips and says why.
if ! /usr/bin/python3 -c 'import openai' 2>/dev/null; then
  echo "install-deps: installing the openai Python client from PyPI"
  $SUDO /usr/bin/python3 -m pip install --quiet --break-system-packages 'openai>=1' ||
    echo "install-deps: could not install the openai client (integration_openai_client will skip)"
fi

# A cross compiler and qemu for 64-bit Arm: the NEON attention code is built and run under
# emulation and must give the x86 code's bits (ctest cross_neon_attention). Not fatal: without
# them that test skips and says why.
mapfile -t cross_missing < <(not_installed gcc-aarch64-linux-gnu libc6-dev-arm64-cross qemu-user)
if [ ${#cross_missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${cross_missing[*]} (the NEON check)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q --no-install-recommends "${cross_missing[@]}" ||
    { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends "${cross_missing[@]}"; } ||
    echo "install-deps: could not install the Arm cross tools (cross_neon_attention will skip)"
fi

# Headless Chromium for the page's browser test (integration_page: the chat and the dashboard the
# coordinator serves at /). Not fatal: without it that test skips and says why. About 350 MB with
# its libraries (no recommends).
if [ -n "$(not_installed chromium)" ]; then
  echo "install-deps: installing chromium (the page's browser test)"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get install -y -q --no-install-recommends chromium ||
    { $SUDO apt-get update -q && $SUDO apt-get install -y -q --no-install-recommends chromium; } ||
    echo "install-deps: could not install chromium (integration_page will skip)"
fi

# CUDA is not installed from here (it is not in Debian's main archive); the build uses it when it
# finds it (CMake OROCHI_CUDA=AUTO): say what is there.
nvcc_bin="$(command -v nvcc || true)"
[ -n "$nvcc_bin" ] || { [ -x /usr/local/cuda/bin/nvcc ] && nvcc_bin=/usr/local/cuda/bin/nvcc; }
if [ -n "$nvcc_bin" ]; then
  cuda_lib="$(dirname "$(dirname "$(readlink -f "$nvcc_bin")")")/lib64"
  cublas="no cuBLAS"
  ls "$cuda_lib"/libcublas.so* >/dev/null 2>&1 && cublas="cuBLAS in $cuda_lib"
  echo "install-deps: CUDA: $("$nvcc_bin" --version | sed -n 's/.*release \([0-9.]*\).*/nvcc \1/p') at $nvcc_bin, $cublas: the GPU kernels and worker will be built"
else
  echo "install-deps: CUDA: no nvcc found: the build is CPU only (the GPU worker is left out)"
fi
