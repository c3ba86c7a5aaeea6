#!/usr/bin/env bash
# Nsight Compute on the decode step's one attention launch (`rope_decode_attention`: the RoPE prologue, the cache
# writes, the attention and the o_proj's quant, at TABLE's config), per batch and model:
#     OUT=$OUT bash benchmarks/attention_ncu.sh [BATCHES] [MODELS] [HEADS]     (default: 1,8,32 llama,qwen3 32,8)
# Why: at Llama-3.1-8B batch 8 on the H100 the launch took 12.8 us a layer in the step against 5.5 us of cache bytes
# (docs/benchmarks.md, "Every GPU test on one tree; Llama-3.1-8B at batch 8 below the line on the H100"), and no
# config of the sweep came closer; where a program's time goes (DRAM and L2 throughput, occupancy and waves, what
# its warps stall on) is what decides the next change. ncu flushes the caches before the profiled launch (its
# default), so the cache bytes come from HBM, as they do in a step. The third launch of each is profiled (the first
# compiles and makes the merge counters). Each report's full text goes to $OUT/ncu_b<batch>_<model>.txt; the lines
# printed here are its headline figures and the rules' notes on stalls.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=.
out=${OUT:-/tmp/attention_ncu}
mkdir -p "$out"
command -v ncu >/dev/null || { echo "ncu (Nsight Compute) is not on PATH" >&2; exit 2; }
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats
          --section SchedulerStats --section MemoryWorkloadAnalysis)
rc=0
IFS=, read -ra batches <<<"${1:-1,8,32}"
IFS=, read -ra models <<<"${2:-llama,qwen3}"
for batch in "${batches[@]}"; do
    for model in "${models[@]}"; do
        report="$out/ncu_b${batch}_${model}.txt"
        ncu --clock-control none -k regex:_decode_attention_kernel --launch-skip 2 --launch-count 1 "${sections[@]}" \
            python benchmarks/rope_attention.py --once 3 --batches "$batch" --models "$model" --heads "${3:-32,8}" \
            >"$report" 2>&1 || { echo "batch $batch $model: ncu failed, see $report" >&2; rc=1; continue; }
        echo "== batch $batch, $model, heads ${3:-32,8}"
        grep -E "^ +(Duration|DRAM Throughput|L2 Cache Throughput|Memory Throughput|Registers Per Thread|Dynamic Shared Memory Per Block|Grid Size|Waves Per SM|Block Limit Registers|Block Limit Shared Mem|Theoretical Occupancy|Achieved Occupancy|Warp Cycles Per Issued Instruction|Issued Warp Per Scheduler) " "$report"
        grep -E "stall" "$report" | head -6
    done
done
exit $rc
