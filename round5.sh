set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 200 python benchmarks/attention_decode.py --batches 1,8,32,64 --sweep 2>&1 | tee $OUT/sweep.log | grep -v "^\[" | tail -8
grep "sweep batch" $OUT/sweep.log | cut -c1-600
timeout 330 python benchmarks/decode.py --presets qwen3-32b --forms engine --batches 1,8,32,64 \
    --prefill 0 --no-bf16 --steps 20 2>&1 | tee $OUT/decode32.log | grep -v "^\[" | tail -12
