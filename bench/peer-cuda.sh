#!/usr/bin/env bash
# The speed peer with CUDA, for a lent GPU machine: builds llama.cpp (CUDA on, one card kind's
# architecture, shared libraries) on this machine, which has nvcc but may have no GPU, and packs
# llama-bench and llama-quantize with the libraries they load, stripped, as one xz tarball
# (peer.tar.xz: the CUDA library alone is about 90 MB for one architecture, 32 MB packed) in a
# folder that the device tool carries (64 MiB at most); deploy/gpu-check.sh's peer stage unpacks
# and runs it (LD_LIBRARY_PATH at the unpacked folder; the CUDA runtime and cuBLAS come from the
# machine's toolkit, which must be the same major version as the nvcc used here, and the driver
# library from the machine: it is left unresolved at the link, as this machine has none).
#   usage: bench/peer-cuda.sh SRC [PACK_DIR]
#   SRC        a llama.cpp source tree, or a bare git directory (what the search tool's fetch of
#              github:ggerganov/llama.cpp brings)
#   PACK_DIR   default build/peer-cuda (git-ignored: carry it with the device tool's `carry`)
#   PEER_CUDA_ARCH=90      the card's architecture (90: H100 and H200)
#   PEER_CUDA_BUILD=DIR    where it builds (default /tmp/peer-cuda; kept, so a second run resumes)
# On 2 cores the build took about 20 minutes (most of it the matmul and attention templates), the
# packing 45 s.
set -euo pipefail
src=${1:?usage: bench/peer-cuda.sh SRC [PACK_DIR]}
pack=${2:-build/peer-cuda}
arch=${PEER_CUDA_ARCH:-90}
work=${PEER_CUDA_BUILD:-/tmp/peer-cuda}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
command -v nvcc >/dev/null || { echo "peer-cuda: no nvcc (the CUDA toolkit) here" >&2; exit 2; }
mkdir -p "$work"
if [ ! -f "$work/CMakeLists.txt" ]; then
    if [ -f "$src/CMakeLists.txt" ]; then
        cp -r "$src/." "$work/"
    elif git --git-dir="$src" rev-parse HEAD >/dev/null 2>&1; then
        # the vocabulary files under models/ are large and not needed
        git --git-dir="$src" archive HEAD -- . ":(exclude)models/*.gguf" | tar -x -C "$work"
    else
        echo "peer-cuda: $src is neither a llama.cpp source tree nor a git directory" >&2
        exit 2
    fi
fi
echo "peer-cuda: configuring in $work (CUDA architecture $arch)"
cmake -S "$work" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_CURL=OFF \
    -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DBUILD_SHARED_LIBS=ON \
    -DLLAMA_BUILD_TESTS=OFF -DCMAKE_EXE_LINKER_FLAGS="-Wl,--unresolved-symbols=ignore-in-shared-libs" \
    >"$work/configure.log" 2>&1 ||
    { tail -20 "$work/configure.log"; exit 1; }
echo "peer-cuda: building llama-bench and llama-quantize (log: $work/build.log)"
cmake --build "$work/build" -j"$(nproc)" --target llama-bench llama-quantize >"$work/build.log" 2>&1 ||
    { tail -30 "$work/build.log"; exit 1; }
bin="$work/build/bin"
stage="$work/pack"
rm -rf "$stage"
mkdir -p "$stage"
cp "$bin/llama-bench" "$bin/llama-quantize" "$stage/"
# the libraries the two were linked with from the build (ldd cannot list them where the driver
# library is missing, so by their names in the build's bin folder), not the system's
cp "$bin"/lib*.so* "$stage/"
strip --strip-unneeded "$stage"/*
rm -rf "$pack"
mkdir -p "$pack"
echo "peer-cuda: packing $(du -sm "$stage" | cut -f1) MiB into $pack/peer.tar.xz"
tar -C "$stage" -cf - . | xz -9 -T"$(nproc)" >"$pack/peer.tar.xz"
{ git --git-dir="$src" rev-parse HEAD 2>/dev/null || echo "$src"
  echo "CUDA architecture $arch, nvcc $(nvcc --version | sed -n 's/.*release \([0-9.]*\).*/\1/p')"
  echo "files: $(ls "$stage" | tr '\n' ' ')"; } >"$pack/SOURCE"
mib=$(du -sm "$pack" | cut -f1)
echo "peer-cuda: $pack, $mib MiB ($(cat "$pack/SOURCE" | tr '\n' ';'))"
[ "$mib" -le 64 ] || echo "peer-cuda: over the device tool's 64 MiB carry" >&2
