#!/usr/bin/env bash
# The GPU half's checks in one run, for a machine with an NVIDIA GPU (docs/gpu.md, "Checking it on
# a GPU"): a core-only build with CUDA (it needs CMake, a C compiler and the CUDA toolkit, none of
# the actor system's libraries), the `cuda` tests, the copy bandwidth of the device, and the step
# time against width (1..64) of CPU-only, GPU-only and mixed CPU+GPU plans on random-weight models
# of the 135M default shape and of a 1B shape (orochi mkmodel), each step's weight bytes over its
# time in GB/s; on the 1B shape, the partition search for GPU + CPU; and the GPU forward's greedy
# agreement with the CPU's on the bench prompts (orochi-gpu-agreement). HCMP is compared with the Megatron baseline both on two CPU parts and on GPU + CPU.
# The GPU runs are made in both memory modes (--gpu-memory mapped: the arena read in
# place; mirror: device copies) and, for the GPU alone, with CUDA graphs off and on.
#   usage: deploy/gpu-check.sh [OUT_DIR]     (default $OUT, else /tmp/gpu-check)
#   GPU_CHECK_QUICK=1: widths 1,8,64 and 2 repetitions (a first look in about a minute)
# Writes OUT_DIR/gpu.txt (the card), cmake.log, build.log, ctest.log, sanitizer.log (the GPU
# forward test under compute-sanitizer), bandwidth.txt, plans.jsonl (bench --plans) and plans.txt
# (its tables): 8 files, what the device tool brings back; exits non-zero when the build, a cuda
# test or the sanitizer fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out="${1:-${OUT:-/tmp/gpu-check}}"
mkdir -p "$out"
jobs="$(nproc)"
widths=1,2,4,8,16,32,64
reps=5
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then widths=1,8,64; reps=2; fi

echo "== the card"
(nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true) |
    tee "$out/gpu.txt"
echo "== build (core only, CUDA on)"
cmake -S . -B build-gpu -DOROCHI_CORE_ONLY=ON -DOROCHI_CUDA=ON -DOROCHI_CUDA_EMU=OFF \
    -DCMAKE_BUILD_TYPE=Release \
    >"$out/cmake.log" 2>&1 || { tail -30 "$out/cmake.log"; exit 1; }
cmake --build build-gpu -j "$jobs" >"$out/build.log" 2>&1 || { tail -40 "$out/build.log"; exit 1; }
echo "== cuda tests"
status=0
(cd build-gpu && ctest -R cuda --output-on-failure) 2>&1 | tee "$out/ctest.log" || status=1

echo "== the GPU forward under compute-sanitizer memcheck (out-of-bounds and misaligned accesses)"
san="$(command -v compute-sanitizer || true)"
[ -z "$san" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && san=/usr/local/cuda/bin/compute-sanitizer
if [ -n "$san" ]; then
    timeout 300 "$san" --tool memcheck --error-exitcode 3 build-gpu/bin/unit_cuda_forward \
        >"$out/sanitizer.log" 2>&1 || { status=1; tail -30 "$out/sanitizer.log"; }
    tail -3 "$out/sanitizer.log"
else
    echo "no compute-sanitizer here: not run" | tee "$out/sanitizer.log"
fi

echo "== device copy bandwidth (device to device, bytes read + written)"
if python3 -c 'import torch' 2>/dev/null; then
    python3 - <<'PY' | tee "$out/bandwidth.txt"
import torch
n = 1 << 30
a = torch.empty(n, dtype=torch.uint8, device="cuda"); b = torch.empty_like(a)
for _ in range(3): b.copy_(a)
torch.cuda.synchronize()
s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
s.record()
for _ in range(10): b.copy_(a)
e.record(); torch.cuda.synchronize()
print("copy: %.0f GB/s (read + write)" % (2 * 10 * n / (s.elapsed_time(e) / 1e3) / 1e9))
PY
else
    echo "no torch here: copy bandwidth not measured" | tee "$out/bandwidth.txt"
fi

bin=build-gpu/bin/orochi
cores="$jobs"
half=$(( cores / 2 > 0 ? cores / 2 : 1 ))
models=()
"$bin" mkmodel --out /tmp/gc-135m.gguf --layers 30 --dim 576 --ffn 1536 --heads 9 --kv-heads 3 \
    --vocab 49152 --ctx 8192 --type q4_1 --seed 1 --tied >/dev/null
models+=(/tmp/gc-135m.gguf)
"$bin" mkmodel --out /tmp/gc-1b.gguf --layers 16 --dim 2048 --ffn 8192 --heads 32 --kv-heads 8 \
    --vocab 32000 --ctx 8192 --type q4_1 --seed 1 >/dev/null
models+=(/tmp/gc-1b.gguf)
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] && models+=(models/SmolLM2-135M-Instruct.Q4_1.gguf)

: >"$out/plans.txt"
# GPU against CPU numbers on the bench prompts: the trained model where it was carried here,
# else the random one of its shape
am=/tmp/gc-135m.gguf
[ -f models/SmolLM2-135M-Instruct.Q4_1.gguf ] && am=models/SmolLM2-135M-Instruct.Q4_1.gguf
echo "== $am: the GPU forward's greedy agreement with the CPU's (teacher-forced)" |
    tee -a "$out/plans.txt"
build-gpu/bin/orochi-gpu-agreement --model "$am" --tokens 32 --json "$out/plans.jsonl" 2>&1 |
    tee -a "$out/plans.txt" || status=1
for m in "${models[@]}"; do
    common=(--model "$m" --widths "$widths" --reps "$reps" --ctx 256 --json "$out/plans.jsonl")
    for mode in "mapped off" "mirror off" "mirror on" "mapped on"; do
        set -- $mode
        [ "${GPU_CHECK_QUICK:-0}" = 1 ] && [ "$1 $2" = "mapped on" ] && continue
        echo "== $m: GPU only, memory $1, graphs $2" | tee -a "$out/plans.txt"
        "$bin" bench --plans "${common[@]}" --parts 1 --devices gpu --plan hcmp:even \
            --gpu-memory "$1" --gpu-graphs "$2" 2>&1 | tee -a "$out/plans.txt" || status=1
    done
    echo "== $m: CPU only, $cores threads" | tee -a "$out/plans.txt"
    "$bin" bench --plans "${common[@]}" --parts 1 --devices cpu --threads-per-part "$cores" \
        --plan hcmp:even 2>&1 | tee -a "$out/plans.txt" || status=1
    for mem in mapped mirror; do
        echo "== $m: GPU ($mem) + CPU ($half threads each part)" | tee -a "$out/plans.txt"
        "$bin" bench --plans "${common[@]}" --parts 2 --devices gpu,cpu --threads-per-part \
            "$half" --gpu-memory "$mem" --plan hcmp:0.9/0.1 --plan split:0.9/0.1 \
            --plan hcmp:0.7/0.3 --plan megatron:0.9/0.1 2>&1 | tee -a "$out/plans.txt" || status=1
    done
    if [ "$m" = /tmp/gc-1b.gguf ]; then
        echo "== $m: the partition search for GPU + CPU (ARCA's split)" | tee -a "$out/plans.txt"
        rm -f /tmp/gc-search.json
        "$bin" bench --plans --model "$m" --parts 2 --devices gpu,cpu --threads-per-part "$half" \
            --widths 1,8 --reps 2 --ctx 256 --search /tmp/gc-search.json 2>&1 |
            tee -a "$out/plans.txt" || status=1
    fi
    echo "== $m: two CPU parts, HCMP against Megatron ($half threads each)" | tee -a "$out/plans.txt"
    "$bin" bench --plans "${common[@]}" --parts 2 --devices cpu,cpu --threads-per-part "$half" \
        --plan hcmp:even --plan megatron:even 2>&1 | tee -a "$out/plans.txt" || status=1
done
echo "== gpu-check: $([ $status = 0 ] && echo ok || echo FAILED) (results in $out)"
exit $status
