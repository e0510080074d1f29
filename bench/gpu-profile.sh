#!/usr/bin/env bash
# Where a GPU forward step's time goes, kernel by kernel, on a machine with an NVIDIA GPU and
# Nsight Compute (docs/gpu.md, "Profiling the GPU forward"): `orochi bench --plans` on the GPU alone
# (mirror memory, graphs off, so each kernel is its own launch) under
# `ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum` and what bounds each kernel
# (registers a thread; achieved occupancy, issue slots, L1, L2 and DRAM throughput, % of peak), at width 1 and width
# 16, on a random-weight model (default: the 1B shape of deploy/gpu-check.sh), summarised by
# bench/gpu_profile.py: per kernel and launch shape the device time, its share, the DRAM bytes
# read over it (GB/s) and those bounds; per kernel the warps stalled per instruction issued by
# reason (memory, barrier, fixed latency, a busy unit: GPU_PROFILE_STALLS=0 leaves them out).
#   usage: bench/gpu-profile.sh [OUT_DIR]      (default $OUT, else /tmp/gpu-profile)
#   GPU_PROFILE_MODEL=PATH  another model (8b: the 8B shape at Q4_K, /tmp/gc-8b-q4_k.gguf, made
#                           where missing); GPU_PROFILE_WIDTHS="1 16" the widths profiled;
#   GPU_PROFILE_NCU_ARGS="..."  more ncu options, e.g. "--launch-skip 600 --launch-count 700" to
#                           profile one 8B step's kernels past the prefill (ncu replays each
#                           profiled kernel once per group of metrics: seconds a kernel)
# Writes OUT_DIR/profile.txt and profile-wN.csv per width; needs the core-only CUDA build that
# deploy/gpu-check.sh makes (build-gpu), and makes it when it is missing.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
. deploy/gpu-common.sh
out="${1:-${OUT:-/tmp/gpu-profile}}"
mkdir -p "$out"
[ -x build-gpu/bin/orochi ] || gpu_build /dev/null
ncu="$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1 || true)"
[ -n "$ncu" ] || { echo "no Nsight Compute (ncu) here"; exit 1; }
model="${GPU_PROFILE_MODEL:-/tmp/gc-1b.gguf}"
if [ "$model" = 8b ]; then
    model=/tmp/gc-8b-q4_k.gguf
    [ -f "$model" ] || gpu_model_8b "$model" q4_k
fi
[ -f "$model" ] || gpu_model_1b "$model"
metrics=gpu__time_duration.sum,dram__bytes_read.sum,launch__registers_per_thread
metrics+=,sm__warps_active.avg.pct_of_peak_sustained_active
metrics+=,sm__inst_issued.avg.pct_of_peak_sustained_active,l1tex__throughput.avg.pct_of_peak_sustained_active
metrics+=,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed
if [ "${GPU_PROFILE_STALLS:-1}" != 0 ]; then
    for r in long_scoreboard short_scoreboard wait barrier math_pipe_throttle lg_throttle \
        mio_throttle not_selected branch_resolving; do
        metrics+=,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio
    done
fi
: >"$out/profile.txt"
for w in ${GPU_PROFILE_WIDTHS:-1 16}; do
    # a context of 2 steps of the width: few prefill launches beside the timed ones
    "$ncu" --csv --print-units base --metrics "$metrics" ${GPU_PROFILE_NCU_ARGS:-} \
        build-gpu/bin/orochi bench --plans --model "$model" --widths "$w" --reps 2 --ctx $(( 2 * w )) \
        --parts 1 --devices gpu --plan hcmp:even --gpu-memory mirror --gpu-graphs off \
        >"$out/profile-w$w.csv" 2>"$out/profile-w$w.log" || { tail -20 "$out/profile-w$w.log"; exit 1; }
    python3 bench/gpu_profile.py "$out/profile-w$w.csv" --title "$(basename "$model"), width $w" |
        tee -a "$out/profile.txt"
    rm -f "$out/profile-w$w.log"
done
