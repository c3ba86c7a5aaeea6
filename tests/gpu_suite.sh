#!/usr/bin/env bash
# The GPU tests (`pytest -m gpu`) in three parts, each within one 10-minute call of the device machine:
#     bash tests/gpu_suite.sh 1        (then 2 and 3; a log per part under ${OUT:-/tmp/gpu_suite})
# Parts in the order that matters if time runs short: the pass on whole models first, then the GEMM kernels, then
# the elementwise / attention / RoPE kernels. Every file that has GPU tests is in exactly one part
# (tests/test_gpu_suite.py checks it). A part stops at 540 s and prints what ran; its --durations lines say which
# files to move when a part outgrows its call. Running only the tests of the code a change touched once left a
# failure unseen for sessions (docs/benchmarks.md, "GPU test runs").
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=.
PART1=(tests/patterns/test_pass_gpu.py tests/models/test_models_gpu.py tests/models/test_tp.py
       tests/cli/test_cli_gpu.py tests/fuzz/test_adversarial_models.py tests/fuzz/test_adversarial_ops.py
       tests/patterns/test_zero_fill.py tests/test_scale_semantics.py tests/kernels/test_tickets_streams_gpu.py)
PART2=(tests/kernels/test_blockscale_mm_gpu.py tests/kernels/test_small_m_silu_gpu.py
       tests/kernels/test_quantizing_gemv_gpu.py)
PART3=(tests/kernels/test_triton_elementwise.py tests/kernels/test_pdl_gpu.py tests/kernels/test_attention_kernel_gpu.py
       tests/kernels/test_rms_norm_rope_gpu.py tests/kernels/test_rms_norm_rope_cache.py)
case "${1:-}" in
    1) files=("${PART1[@]}") ;;
    2) files=("${PART2[@]}") ;;
    3) files=("${PART3[@]}") ;;
    *) echo "usage: bash tests/gpu_suite.sh 1|2|3" >&2; exit 2 ;;
esac
out=${OUT:-/tmp/gpu_suite}
mkdir -p "$out"
timeout 540 python -m pytest -q -rs -m gpu -p no:cacheprovider --durations=15 "${files[@]}" >"$out/part$1.log" 2>&1
rc=$?
grep -E "^(FAILED|ERROR|SKIPPED)|passed|failed|^[0-9.]+s (call|setup)" "$out/part$1.log" | tail -40
[ $rc -eq 124 ] && echo "part $1 stopped at its 540 s limit: see $out/part$1.log"
exit $rc
