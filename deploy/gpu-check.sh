#!/usr/bin/env bash
# The GPU half's checks in one run, for a machine with an NVIDIA GPU (docs/gpu.md, "Checking it on
# a GPU"): a core-only build with CUDA (it needs CMake, a C compiler and the CUDA toolkit, none of
# the actor system's libraries), the `cuda` tests, the GPU forward's greedy agreement with the CPU's
# on the bench prompts (orochi-gpu-agreement), the fused launches' step time against one launch per
# op and the quantized matmul's loads in flight (the GPU alone, alternating rounds), attention
# over long prefixes with its key streams cut into parts and without, whole groups with a GPU
# worker where a full build is at hand (integration_gpu_device_group), the copy bandwidth of the
# device, and the step time against width (1..64) of CPU-only, GPU-only and mixed CPU+GPU plans
# on random-weight models of the 135M default shape and of a 1B shape (orochi mkmodel), each
# step's weight bytes over its time in GB/s; on the 1B shape, the partition search for GPU + CPU. HCMP is compared with the Megatron
# baseline both on two CPU parts and on GPU + CPU. The GPU runs are made in both memory modes
# (--gpu-memory mapped: the arena read in place; mirror: device copies) and, for the GPU alone,
# with CUDA graphs off and on, and (mirror, graphs on) with one launch per op against the fused
# launches. Right after the tests: the GPU forward test under compute-sanitizer memcheck and the op
# set's test under racecheck. Last, where a CUDA build of llama.cpp was carried (bench/peer-cuda.sh),
# its llama-bench beside orochi on the 8B shape.
#   usage: deploy/gpu-check.sh [OUT_DIR]     (default $OUT, else /tmp/gpu-check)
#   GPU_CHECK_QUICK=1      widths 1,8,64 and 2 repetitions (a first look in a few minutes)
#   GPU_CHECK_DEADLINE=S   stop starting stages S seconds after the start; each later stage says
#                          it was skipped (for a lent machine's fixed time)
#   GPU_CHECK_STAGES=LIST  run only these of tests,agreement,kquants,roofline,frag,tgroups,
#                          depth,early,fusion,attention,groups,bandwidth,plans,onecopy,
#                          sanitizer,peer
#   GPU_CHECK_PEER=DIR     llama.cpp built with CUDA (bench/peer-cuda.sh: llama-bench and its
#                          libraries in one folder; default build/peer-cuda, carried to the
#                          machine): the peer stage times it beside orochi on the 8B shape
#   GPU_CHECK_PEER_MODELS="TYPE ..."  the peer stage's 8B files (default "q4_k"; any of the
#                          roofline stage's types, made here where missing; q4_k_m: the peer's
#                          own, its llama-quantize of the BF16 file)
#   GPU_CHECK_ROOFLINE="SHAPE:TYPE ..."  the roofline stage's models (default "1b:q4_k 8b:q4_k
#                          8b:q8_0 8b:bf16"; shapes 1b and 8b, any orochi mkmodel type)
#   GPU_CHECK_MODEL=PATH   the trained model for the agreement and the groups (default
#                          models/SmolLM2-135M-Instruct.Q4_1.gguf where it is; else the random
#                          model of its shape)
#   GPU_CHECK_TRAINED_ONLY=1  the trained model's agreement, groups and plans alone (a second
#                          call that brought it)
#   GPU_CHECK_GROUP_BIN=D  a full build's bin directory for the groups (default build/bin);
#   GPU_CHECK_GROUP_LIBS=D its shared libraries, where the machine lacks them (the groups only)
# Writes OUT_DIR/gpu.txt (the card), build.log, ctest.log, plans.txt (the agreement and bench
# tables), plans.jsonl (their JSON lines), group.log, bandwidth.txt and sanitizer.log, and where
# their stages ran onecopy-plan.json, peer.md and peer.jsonl, and summary.md (bench/gpu_summary.py:
# the issue's rows, the matmul's variants, the peer beside orochi): what the device tool brings back; exits non-zero when the build, a test, a run or the sanitizer
# fails.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. deploy/gpu-common.sh
out="${1:-${OUT:-/tmp/gpu-check}}"
mkdir -p "$out"
jobs="$(nproc)"
widths=1,2,4,8,16,32,64
reps=5
if [ "${GPU_CHECK_QUICK:-0}" = 1 ]; then widths=1,8,64; reps=2; fi
stages=",${GPU_CHECK_STAGES:-tests,agreement,kquants,roofline,frag,tgroups,depth,early,fusion,attention,groups,bandwidth,plans,onecopy,sanitizer,peer},"
start=$SECONDS
deadline=${GPU_CHECK_DEADLINE:-100000}
status=0

left() { echo $(( deadline - (SECONDS - start) )); }
# stage NAME NEEDED_S: whether to run stage NAME (asked for, and NEEDED_S seconds left); says why not
stage() {
    [[ $stages == *",$1,"* ]] || return 1
    if [ "$(left)" -lt "$2" ]; then
        echo "== $1: skipped, $(left) s left of GPU_CHECK_DEADLINE (it needs about $2)" | tee -a "$out/plans.txt"
        return 1
    fi
    echo "== $1 ($(( SECONDS - start )) s in)"
}
# bounded CMD...: CMD under a timeout of what is left (at most 300 s); its status, and says so when
# it fails (77 is a test's skip); with under 5 s left it runs nothing and says so
bounded() {
    local t; t=$(left); [ "$t" -gt 300 ] && t=300
    if [ "$t" -lt 5 ]; then echo "   skipped, out of GPU_CHECK_DEADLINE: $*"; return 0; fi
    local rc=0
    timeout "$t" "$@" || rc=$?
    [ $rc = 0 ] || [ $rc = 77 ] || echo "   failed (status $rc; 124: out of its ${t} s): $*"
    return $rc
}

# need_model SHAPE TYPE: m=/tmp/gc-SHAPE-TYPE.gguf, the random model of SHAPE (1b, 8b: gpu_model_*)
# at TYPE, made here where missing (once per machine: a later run of this script reuses it)
need_model() {
    m=/tmp/gc-$1-$2.gguf
    [ -f "$m" ] || { echo "== making $m"; "gpu_model_$1" "$m" "$2"; }
}
# stage_model SPEC: a stage's model SHAPE:TYPE into $shape, $t and $m (need_model); 1, saying so,
# with under 40 s left for it
stage_model() {
    shape=${1%%:*} t=${1#*:} m=/tmp/gc-${1%%:*}-${1#*:}.gguf
    if [ "$(left)" -lt 40 ]; then
        echo "== $m: skipped, $(left) s left" | tee -a "$out/plans.txt"
        return 1
    fi
    need_model "$shape" "$t"
}

echo "== the card"
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv || true
  echo "host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $jobs CPUs, $(free -g | awk '/Mem:/{print $2}') GiB"
  echo "load average: $(cut -d' ' -f1-3 /proc/loadavg)"; } 2>&1 | tee "$out/gpu.txt"
echo "== build (core only, CUDA on)"
gpu_build "$out/build.log" || { tail -40 "$out/build.log"; exit 1; }
: >"$out/plans.txt"
: >"$out/group.log"
bin=build-gpu/bin/orochi

if stage tests 30; then
    (cd build-gpu && bounded ctest -R cuda --output-on-failure) 2>&1 | tee "$out/ctest.log" || status=1
fi

# correctness before timing: the sanitizers right after the tests
if stage sanitizer 40; then
    echo "== the GPU forward under compute-sanitizer memcheck (out-of-bounds and misaligned accesses)"
    san="$(command -v compute-sanitizer || true)"
    [ -z "$san" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && san=/usr/local/cuda/bin/compute-sanitizer
    if [ -n "$san" ]; then
        mkdir -p /tmp/gc-unit  # the test makes its models with orochi mkmodel (ctest sets these)
        OROCHI_BIN="$PWD/$bin" OROCHI_TMP=/tmp/gc-unit \
            bounded "$san" --tool memcheck --error-exitcode 3 build-gpu/bin/unit_cuda_forward \
            >"$out/sanitizer.log" 2>&1 || { status=1; tail -30 "$out/sanitizer.log"; }
        tail -3 "$out/sanitizer.log"
        # the kernels that share memory between warps (rmsnorm, attention, its tiles and joins)
        echo "== every op under compute-sanitizer racecheck (shared-memory hazards)" |
            tee -a "$out/sanitizer.log"
        OROCHI_BIN="$PWD/$bin" OROCHI_TMP=/tmp/gc-unit \
            bounded "$san" --tool racecheck --error-exitcode 3 build-gpu/bin/unit_cuda_kernels \
            >>"$out/sanitizer.log" 2>&1 || { status=1; tail -30 "$out/sanitizer.log"; }
        tail -3 "$out/sanitizer.log"
    else
        echo "no compute-sanitizer here: not run" | tee "$out/sanitizer.log"
    fi
fi

trained="${GPU_CHECK_MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}"
[ -f "$trained" ] || trained=""
only=${GPU_CHECK_TRAINED_ONLY:-0}
models=()
if [ "$only" = 1 ]; then
    [ -n "$trained" ] || { echo "GPU_CHECK_TRAINED_ONLY=1 but no trained model here"; exit 1; }
else
    # made once per machine: a second run of this script (other stages) reuses them
    [ -f /tmp/gc-1b.gguf ] || gpu_model_1b /tmp/gc-1b.gguf
    [ -f /tmp/gc-135m.gguf ] || "$bin" mkmodel --out /tmp/gc-135m.gguf --layers 30 --dim 576 --ffn 1536 --heads 9 \
        --kv-heads 3 --vocab 49152 --ctx 8192 --type q4_1 --seed 1 --tied >/dev/null
    models+=(/tmp/gc-1b.gguf /tmp/gc-135m.gguf)
fi
[ -n "$trained" ] && models+=("$trained")

# GPU against CPU numbers on the bench prompts: the trained model where it is here, else the
# random one of its shape
if stage agreement 20; then
    am=${trained:-/tmp/gc-135m.gguf}
    echo "== $am: the GPU forward's greedy agreement with the CPU's (teacher-forced)" |
        tee -a "$out/plans.txt"
    bounded build-gpu/bin/orochi-gpu-agreement --model "$am" --tokens 32 --json "$out/plans.jsonl" 2>&1 |
        tee -a "$out/plans.txt" || status=1
fi

# gpu_alone MODEL TITLE BENCH_OPTION...: `orochi bench --plans` of the GPU alone (mirror, graphs
# on) on MODEL, its title and table into plans.txt, its JSON lines into plans.jsonl
gpu_alone() {
    local m=$1 title=$2
    shift 2
    echo "== $m: GPU only, mirror, graphs on, $title" | tee -a "$out/plans.txt"
    bounded "$bin" bench --plans --model "$m" --reps 3 --json "$out/plans.jsonl" --parts 1 \
        --devices gpu --plan hcmp:even --gpu-memory mirror --gpu-graphs on "$@" 2>&1 |
        tee -a "$out/plans.txt" || status=1
}

# the K-quants (what the Q4_K_M files users run hold): the GPU forward's greedy agreement with the
# CPU's on the 1B shape at Q4_K and Q6_K (random weights, 4 bench prompts, 16 tokens), the
# quantized matmul on CUDA cores and on tensor cores
if stage kquants 30; then
    for t in q4_k q6_k; do
        need_model 1b "$t"
        for mm in cuda tensor; do
            echo "== /tmp/gc-1b-$t.gguf: the GPU forward's greedy agreement, matmul on $mm cores" |
                tee -a "$out/plans.txt"
            bounded build-gpu/bin/orochi-gpu-agreement --model /tmp/gc-1b-$t.gguf --tokens 16 \
                --limit 4 --gpu-matmul $mm --json "$out/plans.jsonl" 2>&1 |
                tail -4 | tee -a "$out/plans.txt" || status=1
        done
    done
fi

# the roofline at the sizes users run: the GPU alone on the Llama-3.1-8B shape at Q4_K, Q8_0 and
# BF16 and on the 1B shape at Q4_K, widths 1..64, the quantized matmul on CUDA cores and on tensor
# cores; bench --plans reports each step's weight bytes over its time against the device's copy
# bandwidth (read + write). A 2048-token prompt is 32 steps of 64.
if stage roofline 60; then
    for spec in ${GPU_CHECK_ROOFLINE:-1b:q4_k 8b:q4_k 8b:q8_0 8b:bf16}; do
        stage_model "$spec" || continue
        kinds="cuda tensor"
        [ "$t" = bf16 ] && kinds=cuda  # the float types run on CUDA cores either way
        for mm in $kinds; do
            gpu_alone "$m" "quantized matmul on $mm cores" --widths 1,2,4,8,16,32,64 --ctx 256 \
                --gpu-matmul "$mm"
        done
    done
fi

# the tensor-core matmul's inputs in fragment order (--gpu-frag: rounded once by a launch of
# their own, then one 512-byte load a warp per token tile) by default (from 17 tokens), from 2
# tokens, and never: the GPU alone (mirror, graphs on) on the 8B and 1B shapes at Q4_K (the
# roofline stage's files, made here where missing), the variants alternating over two rounds; the
# same bits in all three (unit_cuda_kernels), so only the time may differ
# tc_variants LABEL FLAG WIDTHS VALUE...: the GPU alone on tensor cores (mirror, graphs on) on
# the 8B and 1B shapes at Q4_K with FLAG at each VALUE in turn, over two rounds
tc_variants() {
    local label=$1 flag=$2 widths=$3 spec round v
    shift 3
    for spec in 8b:q4_k 1b:q4_k; do
        stage_model "$spec" || continue
        for round in 1 2; do
            for v in "$@"; do
                gpu_alone "$m" "tensor cores, $label $v (round $round)" --widths "$widths" \
                    --ctx 256 --gpu-matmul tensor "$flag" "$v"
            done
        done
    done
}

if stage frag 60; then
    tc_variants "inputs in fragment order" --gpu-frag 1,2,8,16,17,32,64 auto off on
fi

# the tensor-core matmul's token tiles dealt to 1 (the default), 2, 4 and 8 groups of blocks a
# launch (--gpu-groups: more blocks, each with fewer accumulators, for the wide steps whose blocks
# are too few or too large to fill the card): the GPU alone (mirror, graphs on) on the 8B shape at
# Q4_K, widths 16, 32 and 64 and a 2048-token prompt, and on the 1B shape at the widths, the
# variants alternating over two rounds; the same bits in all (unit_cuda_kernels)
if stage tgroups 60; then
    for spec in 8b:q4_k 1b:q4_k; do
        stage_model "$spec" || continue
        prompt=()
        [ "$shape" = 8b ] && prompt=(--prompt 2048)
        for round in 1 2; do
            for gr in auto 2 4 8; do
                gpu_alone "$m" "tensor cores, token groups $gr (round $round)" --widths 16,32,64 \
                    --ctx 256 --gpu-matmul tensor --gpu-groups "$gr" ${prompt[@]+"${prompt[@]}"}
            done
        done
    done
fi

# the tensor-core matmul's blocks in flight a warp in a step of up to 8 tokens (--gpu-depth: by
# default 8 where the device holds every block of the launch at once with 8, else 4; and 4 and 8
# always): the GPU alone (mirror, graphs on) on the 8B and 1B shapes at Q4_K, widths 1, 2, 4, 8,
# the variants alternating over two rounds; the same bits in all three (unit_cuda_kernels), so
# only the time may differ
if stage depth 60; then
    tc_variants "blocks in flight" --gpu-depth 1,2,4,8 auto 4 8
fi

# the tensor-core matmul launched early (--gpu-early: a programmatic dependent launch after the
# kernel ahead, its first weights into L2 while that one finishes) against plain launches: the GPU
# alone (mirror, graphs on) on the 8B and 1B shapes at Q4_K, widths 1, 2, 8 and 64, alternating
# over two rounds; the same bits (unit_cuda_forward's early case, in the tests stage)
if stage early 60; then
    tc_variants "launched early" --gpu-early 1,2,8,64 off on
fi

# the fused launches against one launch per op, and the quantized matmul by default (2 groups in
# flight per lane up to width 4, else 1) against 1, 2 and 4 always: the GPU alone (mirror, graphs
# on) on the random 1B and 135M shapes, the variants alternating over two rounds so that none has
# the card warmer
if stage fusion 30; then
    for m in /tmp/gc-1b.gguf /tmp/gc-135m.gguf; do
        [ -f "$m" ] || continue
        for round in 1 2; do
            for variant in "on auto" "off auto" "on 1" "on 2" "on 4"; do
                set -- $variant
                gpu_alone "$m" "fused launches $1, groups in flight $2 (round $round)" \
                    --widths 1,2,4,8,16,64 --ctx 256 --gpu-fuse "$1" --gpu-unroll "$2"
            done
        done
    done
fi

# attention over long prefixes: the GPU alone (mirror, graphs on) on the random 1B and 135M shapes
# at contexts 2048 and 8000, widths 1 to 16, alternating: the default (each key stream cut by
# length, 4 keys a warp, the tiled kernel where tokens x keys reach KCUDA_ATT_TILE_MIN_WORK: the
# queries of a KV head and a sequence share each K/V load), the kernel as it was before all three
# (uncut, 1 key, no tiles), the plain kernel cut by length, and the tiles at every width
if stage attention 40; then
    for m in /tmp/gc-1b.gguf /tmp/gc-135m.gguf; do
        [ -f "$m" ] || continue
        for ctx in 2048 8000; do
            for variant in "auto 4 auto" "1 1 off" "auto 4 off" "auto 4 on"; do
                set -- $variant
                gpu_alone "$m" "context $ctx, attention parts $1, keys a warp $2, tiles $3" \
                    --widths 1,2,4,8,16 --ctx "$ctx" --gpu-att-parts "$1" --gpu-att-keys "$2" \
                    --gpu-att-tile "$3"
            done
        done
    done
fi

# whole groups (coordinator, workers, speculators) with a real GPU worker: they need a full build
gbin="${GPU_CHECK_GROUP_BIN:-build/bin}"
if stage groups 60; then
    if [ -x "$gbin/orochi-coordinator" ] && [ -x "$gbin/orochi-gpu-agreement" ]; then
        gmodels="/tmp/gc-1b.gguf${trained:+:$trained}"
        cases=()
        if [ "$only" = 1 ]; then gmodels=$trained; cases=(named_models_groups_are_lossless); fi
        (
            lib=$(find /usr/local -name 'libcublas.so.13' 2>/dev/null | head -1 || true)
            [ -n "$lib" ] || lib=$(find /opt -name 'libcublas.so.13' 2>/dev/null | head -1 || true)
            cuda_libs=${lib%/*}
            export LD_LIBRARY_PATH="${GPU_CHECK_GROUP_LIBS:+$GPU_CHECK_GROUP_LIBS:}${cuda_libs:+$cuda_libs:}${LD_LIBRARY_PATH:-}"
            export OROCHI_BIN="$(cd "$gbin" && pwd)/orochi" OROCHI_SOURCE="$PWD" OROCHI_TMP=/tmp/gc-integration
            export OROCHI_GPU_MODELS="$gmodels" PYTHONUNBUFFERED=1
            bounded python3 -u tests/integration/test_gpu_device_group.py "${cases[@]}" || [ $? = 77 ]  # 77: skipped
        ) 2>&1 | tee "$out/group.log" || status=1
    else
        echo "no full build at $gbin (the groups need the actor system's libraries): not run" |
            tee "$out/group.log"
    fi
fi

if stage bandwidth 20; then
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
fi

cores="$jobs"
half=$(( cores / 2 > 0 ? cores / 2 : 1 ))
# plan RUN_TITLE ARGS...: one `orochi bench --plans` run, its table into plans.txt
plan() {
    local title=$1; shift
    # the caller's stage was asked for; with under 15 s left this run is skipped, saying so
    if [ "$(left)" -lt 15 ]; then
        echo "== $title: skipped, $(left) s left" | tee -a "$out/plans.txt"
        return 0
    fi
    echo "== $title" | tee -a "$out/plans.txt"
    bounded "$bin" bench --plans "$@" 2>&1 | tee -a "$out/plans.txt" || status=1
}
if stage plans 30; then
    for m in "${models[@]}"; do
        common=(--model "$m" --widths "$widths" --reps "$reps" --ctx 256 --json "$out/plans.jsonl")
        for mode in "mapped off on" "mirror off on" "mirror on on" "mirror on off" "mapped on on"; do
            set -- $mode
            [ "${GPU_CHECK_QUICK:-0}" = 1 ] && [ "$1 $2" = "mapped on" ] && continue
            plan "$m: GPU only, memory $1, graphs $2, fused launches $3" "${common[@]}" --parts 1 \
                --devices gpu --plan hcmp:even --gpu-memory "$1" --gpu-graphs "$2" --gpu-fuse "$3"
        done
        plan "$m: CPU only, $cores threads" "${common[@]}" --parts 1 --devices cpu \
            --threads-per-part "$cores" --plan hcmp:even
        for mem in mapped mirror; do
            plan "$m: GPU ($mem) + CPU ($half threads each part)" "${common[@]}" --parts 2 \
                --devices gpu,cpu --threads-per-part "$half" --gpu-memory "$mem" --plan hcmp:0.9/0.1 \
                --plan split:0.9/0.1 --plan hcmp:0.7/0.3 --plan megatron:0.9/0.1
        done
        if [ "$m" = /tmp/gc-1b.gguf ]; then
            rm -f /tmp/gc-search.json
            plan "$m: the partition search for GPU + CPU (ARCA's split)" --model "$m" --parts 2 \
                --devices gpu,cpu --threads-per-part "$half" --widths 1,8 --reps 2 --ctx 256 \
                --search /tmp/gc-search.json
        fi
        plan "$m: two CPU parts, HCMP against Megatron ($half threads each)" "${common[@]}" \
            --parts 2 --devices cpu,cpu --threads-per-part "$half" --plan hcmp:even --plan megatron:even
    done
fi

# one copy of the weights and the devices chosen by measurement: the GPU alone on the 8B shape at
# Q4_K with its weights in device memory and read in place from the file (mapped: over the bus on
# a discrete card); then the partition search for GPU + CPU on the 1B shape at Q4_K with a
# device-memory limit of half the model — the GPU cannot run alone, and the search must find a
# split that beats the CPU alone (its "devices:" line says which and why; the 1B shape keeps the
# CPU's share of each candidate to tens of milliseconds)
if stage onecopy 90; then
    need_model 8b q4_k
    for w in device mapped; do
        plan "$m: GPU alone, weights $w" --model "$m" --parts 1 --devices gpu --plan hcmp:even \
            --widths 1,8 --reps 3 --ctx 256 --gpu-weights "$w" --json "$out/plans.jsonl"
    done
    need_model 1b q4_k
    halfm=$(( $(stat -c %s "$m") / 2 / 1048576 ))M
    rm -f /tmp/gc-limit.json
    plan "$m: the partition search for GPU + CPU under --gpu-memory-limit $halfm" --model "$m" \
        --parts 2 --devices gpu,cpu --threads-per-part "$half" --widths 1,8 --reps 1 --ctx 256 \
        --gpu-memory-limit "$halfm" --search /tmp/gc-limit.json
    cp /tmp/gc-limit.json "$out/onecopy-plan.json" 2>/dev/null || true
fi

# the peer on the same card and files: llama.cpp's llama-bench (built with CUDA for this card's
# kind by bench/peer-cuda.sh, carried here) on the 8B shape, all layers on the GPU: a width-1 step
# (tg128), a 64-token prompt (pp64: one step of 64) and a 2048-token one (pp2048); beside it
# orochi's GPU alone (mirror, graphs on, the defaults) at widths 1 and 64 (context 256) and a
# 2048-token prompt (bench --plans --prompt: chunks of 64 from position 0); the two alternate over
# two rounds. The peer comes as bench/peer-cuda.sh packs it (peer.tar.xz, unpacked into
# /tmp/gc-peer) or unpacked. peer.md holds the peer's tables, its JSON lines go into peer.jsonl,
# orochi's into plans.jsonl.
if stage peer 60; then
    pdir="${GPU_CHECK_PEER:-build/peer-cuda}"
    if [ ! -x "$pdir/llama-bench" ] && [ -f "$pdir/peer.tar.xz" ]; then
        echo "== unpacking the peer ($(head -1 "$pdir/SOURCE" 2>/dev/null)) into /tmp/gc-peer"
        rm -rf /tmp/gc-peer && mkdir -p /tmp/gc-peer
        tar -xJf "$pdir/peer.tar.xz" -C /tmp/gc-peer 2>/dev/null ||
            python3 -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
                "$pdir/peer.tar.xz" /tmp/gc-peer
        pdir=/tmp/gc-peer
    fi
    if [ -x "$pdir/llama-bench" ]; then
        : >"$out/peer.md"
        for t in ${GPU_CHECK_PEER_MODELS:-q4_k}; do
            q=/tmp/gc-8b-$t.gguf
            if [ "$t" = q4_k_m ] && [ ! -f "$q" ] && [ "$(left)" -ge 40 ]; then
                # the peer's own file: its llama-quantize from the BF16 one
                need_model 8b bf16
                echo "== making $q with the peer's llama-quantize"
                LD_LIBRARY_PATH="$(cd "$pdir" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                    bounded "$pdir/llama-quantize" "$m" "$q" Q4_K_M >"$out/quantize.log" 2>&1 ||
                    { status=1; tail -5 "$out/quantize.log"; continue; }
            fi
            stage_model "8b:$t" || continue
            for round in 1 2; do
                order="orochi peer"
                [ $round = 2 ] && order="peer orochi"
                for side in $order; do
                    if [ $side = orochi ]; then
                        gpu_alone "$m" "the defaults, a 2048-token prompt (beside the peer, round $round)" \
                            --widths 1,64 --ctx 256 --prompt 2048
                    else
                        echo "== $m: llama-bench, all layers on the GPU (round $round)" | tee -a "$out/peer.md"
                        seen=$(wc -l <"$out/peer.md")
                        prc=0
                        LD_LIBRARY_PATH="$(cd "$pdir" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" \
                            bounded "$pdir/llama-bench" -m "$m" -ngl 99 -p 64,2048 -n 128 -r 3 \
                            -o jsonl -oe md >>"$out/peer.jsonl" 2>>"$out/peer.md" || prc=$?
                        sed -n "$((seen + 1)),\$p" "$out/peer.md" | grep -v '^ggml_cuda_init\|^  Device'
                        # a peer that did not run, or found no GPU and ran on the host's cores:
                        # say so, time it no more
                        if [ $prc != 0 ] || grep -q '"gpu_info": ""' "$out/peer.jsonl"; then
                            echo "== peer: llama-bench $([ $prc != 0 ] && echo "failed (status $prc)" ||
                                echo "found no GPU (its figures are the CPU's)"): stopped" | tee -a "$out/peer.md"
                            status=1
                            break 3
                        fi
                    fi
                done
            done
        done
    else
        echo "== peer: no llama-bench at $pdir (bench/peer-cuda.sh builds it; carry that folder): not run" |
            tee -a "$out/plans.txt"
    fi
fi

# the issue's rows, the variants and the peer in three tables
if [ -s "$out/plans.jsonl" ]; then
    python3 bench/gpu_summary.py "$out/plans.jsonl" "$out/peer.jsonl" >"$out/summary.md" 2>&1 || status=1
    cat "$out/summary.md"
fi

echo "== gpu-check: $([ $status = 0 ] && echo ok || echo FAILED) after $(( SECONDS - start )) s (results in $out)"
exit $status
