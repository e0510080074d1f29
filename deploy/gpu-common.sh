# What deploy/gpu-check.sh and bench/gpu-profile.sh share, sourced from the repository root:
#   gpu_build LOG         the core-only CUDA build in build-gpu (CMake, a C compiler and the CUDA
#                         toolkit; none of the actor system's libraries), its output into LOG
#   gpu_model_1b PATH [TYPE]  the 1B random-weight shape both measure (16 layers, dim 2048, ffn
#                         8192, 32 query and 8 KV heads, vocabulary 32000; Q4_1 unless TYPE)
#   gpu_model_8b PATH [TYPE]  the Llama-3.1-8B shape (32 layers, dim 4096, ffn 14336, 32 query and
#                         8 KV heads, vocabulary 128256; Q4_K unless TYPE)
gpu_build() {
    { cmake -S . -B build-gpu -DOROCHI_CORE_ONLY=ON -DOROCHI_CUDA=ON -DOROCHI_CUDA_EMU=OFF \
        -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j "$(nproc)"; } >"$1" 2>&1
}

gpu_model_1b() {
    build-gpu/bin/orochi mkmodel --out "$1" --layers 16 --dim 2048 --ffn 8192 --heads 32 \
        --kv-heads 8 --vocab 32000 --ctx 8192 --type "${2:-q4_1}" --seed 1 >/dev/null
}

gpu_model_8b() {
    build-gpu/bin/orochi mkmodel --out "$1" --layers 32 --dim 4096 --ffn 14336 --heads 32 \
        --kv-heads 8 --vocab 128256 --ctx 8192 --type "${2:-q4_k}" --seed 1 >/dev/null
}
