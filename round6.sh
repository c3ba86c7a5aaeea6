set -uo pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=.
timeout 80 python -m pytest -q -p no:logging -m gpu tests/kernels/test_attention_kernel_gpu.py -k "rope_decode" -x 2>&1 | grep -v DEBUG > $OUT/tests.log
tail -4 $OUT/tests.log
timeout 250 python benchmarks/decode.py --presets llama3.1-8b,qwen3-8b --forms engine --batches 1,8,32,64 \
    --prefill 0 --no-bf16 --steps 20 --also=-rope_attention 2>&1 | tee $OUT/decode.log | grep -v "^\[" | tail -24
