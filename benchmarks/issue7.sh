#!/usr/bin/env bash
# Issue 7's figures (docs/benchmarks.md, "Where issue 7 stands") in parts, each within one 10-minute call of the
# device machine; outputs under ${OUT:-/tmp/issue7}, and after each part the targets table of every output there
# so far (benchmarks/issue7_targets.py):
#     OUT=$OUT bash benchmarks/issue7.sh 1    engine decode, Llama-3.1-8B and Qwen3-8B, with bf16 and prefill (~300 s)
#     OUT=$OUT bash benchmarks/issue7.sh 2    engine decode, Qwen3-32B: batch 1 in 5 interleaved rounds, 8-64 (~200 s)
#     OUT=$OUT bash benchmarks/issue7.sh 3    the fused-kernel and block-scale GEMM tables (~265 s)
#     OUT=$OUT bash benchmarks/issue7.sh 4    HF form decode, Llama-3.1-8B, batch 1 and 8
#     OUT=$OUT bash benchmarks/issue7.sh 5    HF form decode, Llama-3.1-8B, batch 32 and 64
#     OUT=$OUT bash benchmarks/issue7.sh 6    HF form decode, Qwen3-8B, batch 1 and 8
#     OUT=$OUT bash benchmarks/issue7.sh 7    HF form decode, Qwen3-8B, batch 32 and 64
#     OUT=$OUT bash benchmarks/issue7.sh split  the decode row over several programs (_tiles.SPLIT_ROWS): its GPU
#                                               test, its sweep, and Qwen3-32B at batch 1 with the sweep's rows and
#                                               without, one after the other on one machine (238 s)
#     OUT=$OUT bash benchmarks/issue7.sh verify  steps of several tokens (verifying draft tokens): gqa_tokens.py's
#                                               attention by tokens (with each form against fp32), then Llama-3.1-8B
#                                               HF and engine steps of 4 tokens at batch 8 and 32 (~380 s, H100)
#     OUT=$OUT bash benchmarks/issue7.sh gqa     HF decode at batch 1, 8 kv heads x 4 query heads each (Llama-3.1-8B,
#                                               Qwen3-8B): the grouped SDPA (the pass) against the copy (the pass minus
#                                               gqa_attention), 3 interleaved rounds (H100, fresh: 240-270 s a model
#                                               in one run, both in 420 s in another)
#     OUT=$OUT bash benchmarks/issue7.sh tokens  engine steps of 4 tokens (verifying draft tokens) at batch 8 and 32,
#                                               Llama-3.1-8B and Qwen3-8B, with decode_attention_tokens_quant and with
#                                               the masked form it replaces (--set patterns._decode_tokens.MAX_TOKENS=1),
#                                               after the op's GPU tests
#     OUT=$OUT bash benchmarks/issue7.sh rope    steps of 4 tokens with the RoPE / cache writes in the token form's
#                                               launch (rope_decode_attention_tokens_quant) and without (the pass minus
#                                               rope_attention), interleaved: the op's GPU tests, the ops alone, the
#                                               8B models' engine steps at batch 8 and 32 (155 s on a fresh H100
#                                               before --interleave 3 was added; 3 rounds of Llama: 51 s)
#     OUT=$OUT bash benchmarks/issue7.sh rope32b  the same A/B on Qwen3-32B's 2-token steps at batch 1 and 8 (112 s)
#     OUT=$OUT bash benchmarks/issue7.sh plain   the token form without the quant (a per-tensor o_proj): its GPU
#                                               tests, then per-tensor 8B engine steps of 4 tokens at batch 8 and 32
#                                               with and without rope_attention (rope_decode_attention_tokens) (132 s)
#     OUT=$OUT bash benchmarks/issue7.sh rows    steps of 8 tokens (32 rows per kv head) in the token form against
#                                               Inductor's attention: the attention alone with its copies and quant,
#                                               then Llama-3.1-8B engine steps at batch 1 and 8 with
#                                               _decode_tokens.MAX_ROWS = 32 and = 16 (111 s; times of the thirty-second
#                                               session, H100, warm machine after rope); with the plain forms
#                                               (a per-tensor o_proj's) beside the quantized ones since
#     OUT=$OUT bash benchmarks/issue7.sh rows64  64 rows per kv head (8 tokens x 8 heads, the committed bound since
#                                               the thirty-third session): the attention alone (quantized and plain),
#                                               then Qwen3-32B engine steps of 8 tokens (16 layers) at batch 1 and 8
#                                               with MAX_ROWS = 64 and = 32 (its 4-layer form: 68 s on a warm H100),
#                                               then 64 with rope_attention taking 64 rows (MAX_NORM_TOKEN_ROWS = 64;
#                                               197 s on a fresh H100, thirty-fourth session)
#     OUT=$OUT bash benchmarks/issue7.sh bounds  rope_attention's token bounds at 32 rows per kv head (4 heads x 8
#                                               tokens): Qwen3-8B with the RoPE and norms in the launch
#                                               (MAX_NORM_TOKEN_ROWS = 32) and without, Llama-3.1-8B with and
#                                               without rope_attention; engine steps of 16 layers at batch 1, 8, 32,
#                                               2 interleaved rounds (146 s, H100, thirty-sixth session)
#     OUT=$OUT bash benchmarks/issue7.sh llama64  Llama-3.1-8B's token form at 64 rows per kv head (4 heads x 16
#                                               tokens; the 64-row bound rests on Qwen3-32B's 8 x 8): engine steps of
#                                               16 layers at batch 1 and 8 with MAX_ROWS = 64 and = 32 (Inductor's
#                                               attention), 2 interleaved rounds each (70 s warm, H100,
#                                               thirty-seventh session: 64 ties at b1, 3.1% faster at b8)
#     OUT=$OUT bash benchmarks/issue7.sh visible  decode_attention.SPLIT_VISIBLE (the upto forms' splits over the
#                                               visible keys; off until timed): its GPU tests, then the upto op with
#                                               and without it, 501 of 4096 slots in use and 501 of 576, batch 1-64
#                                               (H100, thirty-eighth session: on since)
#     OUT=$OUT bash benchmarks/issue7.sh fewer   the RoPE launch at 2-4 splits (AttentionConfig.splits, no TABLE row
#                                               yet) against the programs-per-SM configs and TABLE's, batch 1 and 8,
#                                               the 8B heads and Qwen3-32B's (149 s on a warm H100, thirty-ninth
#                                               session: no split count won; 64-key tiles at batch 1 did)
#     OUT=$OUT bash benchmarks/issue7.sh ropewide  the RoPE token launch at 32 rows on WIDE's 4-warp configs
#                                               (decode_attention.ROPE_WIDE_ROWS = 32) against TABLE's: Llama-3.1-8B
#                                               8-token steps (4 heads x 8 tokens), 16 layers, batch 1 / 8 / 32; then
#                                               Qwen3-8B's with its norms in the launch at 32 rows on WIDE's configs
#                                               against the pass minus rope_attention (written in the thirty-eighth
#                                               session, not run)
#     OUT=$OUT bash benchmarks/issue7.sh sequence  every launch of a 4-layer step in order, with and without the
#                                               pass (profile_step.py --sequence): Qwen3-32B batch 1 and Llama-3.1-8B
#                                               batch 8, the H100's cells below 1.10x, launch by launch; then the
#                                               attention launch's phases with its RoPE prologue split in three
#                                               (attention_timeline.py; Qwen3's is ~1400 cycles longer) (~75 s on
#                                               a fresh H100, fortieth session)
#     OUT=$OUT bash benchmarks/issue7.sh cold    the RoPE launch's configs swept with the caches out of L2, as in a
#                                               step (rope_attention.py --sweep --cold; the earlier sweeps read
#                                               them hot): batch 1 and 8, the 8B heads and Qwen3-32B's (196 s,
#                                               H100, fortieth session)
#     OUT=$OUT bash benchmarks/issue7.sh instep  the attention launch's phase clocks inside the engine step
#                                               (attention_in_step.py: 4 layers, Llama-3.1-8B and Qwen3-32B at batch
#                                               1 and 8), then alone with L2 flushed (attention_timeline.py), to see
#                                               why launches made shorter alone did not shorten the step (83 s,
#                                               H100, forty-first session: in the step as alone)
#     OUT=$OUT bash benchmarks/issue7.sh mergerows  the splits' merge on the real rows (MERGE_R, on since the
#                                               fortieth session) against the merge on the MMA's whole tile (a
#                                               copy of the tree with MERGE_R = BLOCK_R): its GPU bit test, the launch's
#                                               phases both ways, then Llama-3.1-8B batch 1 / 8 and Qwen3-32B batch 1
#                                               engine steps, 2 interleaved rounds each, tree then copy (319 s,
#                                               H100, forty-first session: Qwen3-32B batch 1 23 us a step faster)
#     OUT=$OUT bash benchmarks/issue7.sh mergeseq  each launch of a 4-layer step with the pass and the idle gap after it
#                                               (profile_step.py --sequence), Llama-3.1-8B and Qwen3-32B at batch 1,
#                                               the tree then the whole-tile merge's copy: the merge made Qwen3-32B's
#                                               step 23 us shorter and Llama's not at all, with both launches shorter
#                                               alone; does the gap after the launch grow where the step did not
#                                               move? (not run)
#     OUT=$OUT bash benchmarks/issue7.sh row1  TABLE's batch-1 row (chosen on the H100 in the thirty-ninth session)
#                                               against a copy without it, Qwen3-32B then Llama-3.1-8B at batch 1, 2
#                                               interleaved rounds each: for the H200, where it was never timed (not run)
#     OUT=$OUT bash benchmarks/issue7.sh tokens1  4-token steps at batch 1 (Llama-3.1-8B, Qwen3-8B: 16 query rows a kv
#                                               head, 16 layers), TABLE as committed against a copy without its
#                                               batch-1 row (chosen on one-token launches; 8 pairs then take the
#                                               128-key row they had before), 2 interleaved rounds each (not run)
#     OUT=DIR bash benchmarks/issue7.sh targets    only the table, of the outputs in DIR (e.g. every part's, fetched)
# Times: one H200, 2026-12-05 (parts 1-3 as separate commands, before this script; through it: split 238 s,
# 2 ~150 s, 4 ~190 s, 6 265 s on a warm machine, twentieth session); on an H100, 4 319 s on a fresh machine, 5 275 s
# and 6 263 s (twenty-second session): two HF parts do not fit one 600 s call. The HF form
# compiles each of its layers per variant and batch (54-91 s a cell), so a model's four batches do not fit one
# call: parts 4-7 take two batches each. The device's outputs come back per call: copy every part's files into
# one folder and run `targets` there to see them in one table.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 PYTHONPATH=.
out=${OUT:-/tmp/issue7}
mkdir -p "$out"
decode=(python benchmarks/decode.py --prefill 0 --no-bf16 --steps 20)

edited_copy() {  # a copy of the tree with one sed edit of one file (path under the tree), or a loud failure; its path
    local copy
    copy=$(mktemp -d) && cp -r fp8_fusion_pass benchmarks "$copy"/ || return 1
    cp "$copy/$1" "$copy/$1.orig" && sed -i "$2" "$copy/$1" || return 1
    cmp -s "$copy/$1" "$copy/$1.orig" && { echo "edited_copy: '$2' changed nothing in $1" >&2; return 1; }
    rm "$copy/$1.orig" && echo "$copy"
}
no_batch1_row_copy() {  # attention_configs.TABLE without its batch-1 row: 8 pairs take the 128-key row they had before
    edited_copy fp8_fusion_pass/kernels/triton/attention_configs.py \
        '/^    (8, AttentionConfig(block_t=64, num_warps=8, num_stages=2, programs=1)),$/d'
}
whole_tile_copy() {  # the attention's merge on the MMA's whole tile (MERGE_R = BLOCK_R)
    edited_copy fp8_fusion_pass/kernels/triton/decode_attention.py \
        's/^        MERGE_R=min(block_r, max(triton.next_power_of_2(r), cfg.num_warps)),$/        MERGE_R=block_r,/'
}
case "${1:-}" in
    1) python benchmarks/decode.py --presets llama3.1-8b,qwen3-8b --forms engine --batches 1,8,32,64 --prefill 2048 \
           --steps 30 --json "$out/decode_engine_8b.json" ;;
    2) "${decode[@]}" --presets qwen3-32b --forms engine --batches 1 --interleave 5 --json "$out/decode_engine_32b_b1.json" \
           && "${decode[@]}" --presets qwen3-32b --forms engine --batches 8,32,64 --json "$out/decode_engine_32b.json" ;;
    3) python benchmarks/fused_kernels.py --out "$out" && python benchmarks/gemm.py --ms 1,16,64 --json "$out/gemm.json" ;;
    4) "${decode[@]}" --presets llama3.1-8b --forms hf --batches 1,8 --json "$out/decode_hf_llama_b1_8.json" ;;
    5) "${decode[@]}" --presets llama3.1-8b --forms hf --batches 32,64 --json "$out/decode_hf_llama_b32_64.json" ;;
    6) "${decode[@]}" --presets qwen3-8b --forms hf --batches 1,8 --json "$out/decode_hf_qwen3_b1_8.json" ;;
    7) "${decode[@]}" --presets qwen3-8b --forms hf --batches 32,64 --json "$out/decode_hf_qwen3_b32_64.json" ;;
    split) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_triton_elementwise.py -k split_rows \
           && python benchmarks/fused_kernels.py --sweep --ms 1,4 --sizes 4096,5120,8192 \
                  --ops rms_norm_group_quant,add_rms_norm_group_quant > "$out/split_sweep.txt" \
           && tail -30 "$out/split_sweep.txt" \
           && python benchmarks/with_tiles.py --tables SPLIT_ROWS "$out/split_sweep.txt" "${decode[@]:1}" \
                  --presets qwen3-32b --forms engine --batches 1 --interleave 5 \
                  --json "$out/split_decode_32b_b1_with.json" \
           && "${decode[@]}" --presets qwen3-32b --forms engine --batches 1 --interleave 5 \
                  --json "$out/split_decode_32b_b1_without.json" ;;
    verify) python benchmarks/gqa_tokens.py --batches 1,8,32 > "$out/gqa_tokens.txt" && tail -52 "$out/gqa_tokens.txt" \
           && "${decode[@]}" --presets llama3.1-8b --forms hf,engine --batches 8,32 --tokens 4 \
                  --json "$out/verify_llama.json" ;;  # not decode_*.json: no target counts steps of 4 tokens
    gqa) "${decode[@]}" --presets llama3.1-8b,qwen3-8b --forms hf --batches 1 --also=-gqa_attention --interleave 3 \
             --json "$out/gqa_hf_b1.json" ;;  # not decode_*.json: the targets table has part 4 / 6's cells
    tokens) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_kernel_gpu.py \
                tests/patterns/test_pass_gpu.py -k "tokens" > "$out/tokens_tests.log" 2>&1; tail -4 "$out/tokens_tests.log"
            for most in 16 1; do  # not decode_*.json: no target counts steps of 4 tokens
                "${decode[@]}" --presets llama3.1-8b,qwen3-8b --forms engine --batches 8,32 --tokens 4 \
                    --set "patterns._decode_tokens.MAX_TOKENS=$most" --json "$out/tokens_engine_max$most.json" || exit $?
            done ;;
    rope) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_kernel_gpu.py -k "rope_tokens" \
              > "$out/rope_tests.log" 2>&1; tail -2 "$out/rope_tests.log"
          python benchmarks/rope_attention.py --batches 8,32 --tokens 4 > "$out/rope_tokens_ops.txt" 2>&1
          tail -6 "$out/rope_tokens_ops.txt"
          "${decode[@]}" --presets llama3.1-8b,qwen3-8b --forms engine --batches 8,32 --tokens 4 \
              --also=-rope_attention --interleave 3 --json "$out/rope_tokens_engine.json" ;;  # not decode_*.json: no target counts
    rope32b) "${decode[@]}" --presets qwen3-32b --forms engine --batches 1,8 --tokens 2 --also=-rope_attention \
                 --json "$out/rope_tokens_32b.json" ;;  # steps of several tokens
    plain) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_kernel_gpu.py \
               -k "without_the_quant or (rope_tokens and plain)" > "$out/plain_tests.log" 2>&1; tail -2 "$out/plain_tests.log"
           "${decode[@]}" --presets llama3.1-8b,qwen3-8b --forms engine --batches 8,32 --tokens 4 --scheme per-tensor \
               --also=-rope_attention --interleave 3 --json "$out/plain_tokens_engine.json" ;;  # per-tensor: no target counts it
    rows) python benchmarks/attention_decode.py --tokens 8 --heads 32 --batches 1,8,32 \
              --impls math+quant,masked+quant,tokens_quant,math+copy,masked+copy,tokens > "$out/rows32_ops.txt" 2>&1
          tail -14 "$out/rows32_ops.txt"
          for most in 32 16; do  # not decode_*.json: no target counts steps of several tokens
              "${decode[@]}" --presets llama3.1-8b --forms engine --batches 1,8 --tokens 8 \
                  --set "patterns._decode_tokens.MAX_ROWS=$most" --json "$out/rows_engine_max$most.json" || exit $?
          done ;;
    rows64) python benchmarks/attention_decode.py --tokens 8 --heads 64 --batches 1,8,32 \
                --impls math+quant,tokens_quant,math+copy,tokens > "$out/rows64_ops.txt" 2>&1; tail -10 "$out/rows64_ops.txt"
            # Qwen3-32B's 8 heads per kv head x 8 tokens: 64 rows; the token form (RoPE launch kept), Inductor's
            # attention (32), the token form with its RoPE in the launch (on TABLE's 8-warp rows)
            for run in "tokens:MAX_ROWS=64" "inductor:MAX_ROWS=32" \
                       "rope:MAX_ROWS=64,patterns.rope_attention.MAX_NORM_TOKEN_ROWS=64"; do
                "${decode[@]}" --presets qwen3-32b --forms engine --batches 1,8 --tokens 8 --layers 16 \
                    --set "patterns._decode_tokens.${run#*:}" --json "$out/rows64_engine_${run%%:*}.json" || exit $?
            done ;;
    bounds) for preset in qwen3-8b llama3.1-8b; do  # the Qwen3 run lifts its norms' bound to 32 (Llama's already is)
                "${decode[@]}" --presets $preset --forms engine --batches 1,8,32 --tokens 8 --layers 16 --interleave 2 \
                    --also=-rope_attention --set patterns.rope_attention.MAX_NORM_TOKEN_ROWS=32 \
                    --json "$out/bounds_$preset.json" || exit $?
            done ;;
    llama64) for most in 64 32; do  # not decode_*.json: no target counts steps of several tokens
                 "${decode[@]}" --presets llama3.1-8b --forms engine --batches 1,8 --tokens 16 --layers 16 \
                     --interleave 2 --set "patterns._decode_tokens.MAX_ROWS=$most" \
                     --json "$out/llama64_engine_max$most.json" || exit $?
             done ;;
    visible) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_kernel_gpu.py -k visible \
                 > "$out/visible_tests.log" 2>&1; tail -2 "$out/visible_tests.log"
             for seq in 4096 576; do
                 python benchmarks/attention_decode.py --batches 1,8,32,64 --impls fused_upto,fused_upto_visible \
                     --context 500 --max-seq $seq > "$out/visible_$seq.txt" 2>&1 || exit $?
                 tail -10 "$out/visible_$seq.txt"
             done ;;
    fewer) python benchmarks/rope_attention.py --sweep --programs 1,s2,s3,s4 --batches 1,8 --models llama,qwen3 \
               > "$out/fewer_8b.txt" 2>&1 && tail -6 "$out/fewer_8b.txt" \
           && python benchmarks/rope_attention.py --sweep --programs 1,s2,s3,s4 --heads 64,8 --batches 1,8 \
                  --models qwen3 > "$out/fewer_32b.txt" 2>&1 && tail -4 "$out/fewer_32b.txt" ;;
    ropewide) for wide in 32 0; do  # not decode_*.json: no target counts steps of several tokens
                  "${decode[@]}" --presets llama3.1-8b --forms engine --batches 1,8,32 --tokens 8 --layers 16 \
                      --interleave 2 --set kernels.triton.decode_attention.ROPE_WIDE_ROWS=$wide \
                      --json "$out/ropewide_llama_$wide.json" || exit $?
              done
              "${decode[@]}" --presets qwen3-8b --forms engine --batches 1,8,32 --tokens 8 --layers 16 --interleave 2 \
                  --also=-rope_attention --set patterns.rope_attention.MAX_NORM_TOKEN_ROWS=32,kernels.triton.decode_attention.ROPE_WIDE_ROWS=32 \
                  --json "$out/ropewide_qwen3.json" ;;
    sequence) for run in "qwen3-32b 1" "llama3.1-8b 8"; do
                  python benchmarks/profile_step.py --preset ${run% *} --forms engine --layers 4 --batches ${run#* } \
                      --variants block,block+pass --sequence > "$out/sequence_${run% *}.txt" 2>&1 || exit $?
                  grep -A12 "^summary" "$out/sequence_${run% *}.txt"
              done
              python benchmarks/attention_timeline.py --batches 8,1 --models llama,qwen3 > "$out/timeline.txt" 2>&1 \
                  && grep -E "^batch|^prologue|^key loop |^ticket|^merge|^span" "$out/timeline.txt" ;;
    cold) python benchmarks/rope_attention.py --sweep --cold --programs 0,1,2,s2,s3,s4 --batches 1,8 \
              --models llama,qwen3 > "$out/cold_8b.txt" 2>&1 && tail -6 "$out/cold_8b.txt" \
          && python benchmarks/rope_attention.py --sweep --cold --programs 0,1,2,s2,s3,s4 --heads 64,8 --batches 1,8 \
                 --models qwen3 > "$out/cold_32b.txt" 2>&1 && tail -4 "$out/cold_32b.txt" ;;
    instep) for run in "llama3.1-8b llama 32,8" "qwen3-32b qwen3 64,8"; do  # preset, timeline's model, heads
                read -r preset model heads <<< "$run"
                python benchmarks/attention_in_step.py --preset $preset --layers 4 --batches 1,8 \
                    > "$out/instep_$preset.txt" 2>&1 || exit $?
                grep -A16 "in the step" "$out/instep_$preset.txt"
                python benchmarks/attention_timeline.py --batches 1,8 --models $model --heads $heads \
                    > "$out/alone_$preset.txt" 2>&1 || exit $?
                grep -E "^batch|^prologue|^key loop |^ticket|^merge|^span|^start" "$out/alone_$preset.txt"
            done ;;
    mergerows) python -m pytest -q -m gpu -p no:cacheprovider tests/kernels/test_attention_kernel_gpu.py \
                   -k merge_on_the_real > "$out/mergerows_tests.log" 2>&1; tail -2 "$out/mergerows_tests.log"
               whole=$(whole_tile_copy) || exit 1
               src="$whole/fp8_fusion_pass/kernels/triton/decode_attention.py"
               for source in "" "$src"; do
                   python benchmarks/attention_timeline.py --batches 1,8 --models llama,qwen3 ${source:+--source "$source"} \
                       | grep -E "^batch|^key loop |^ticket|^merge|^span"
               done
               for run in "llama3.1-8b 1" "qwen3-32b 1" "llama3.1-8b 8"; do
                   for tree in real whole; do  # not decode_*.json: the targets table has these cells
                       (cd "$([ $tree = real ] && pwd || echo "$whole")" && "${decode[@]}" --presets ${run% *} \
                           --forms engine --batches ${run#* } --interleave 2 \
                           --json "$out/mergerows_${run% *}_b${run#* }_$tree.json") || exit $?
                   done
               done ;;
    mergeseq) whole=$(whole_tile_copy) || exit 1
              for preset in llama3.1-8b qwen3-32b; do
                  for tree in real whole; do
                      (cd "$([ $tree = real ] && pwd || echo "$whole")" && python benchmarks/profile_step.py \
                          --preset $preset --forms engine --layers 4 --batches 1 --variants block+pass --steps 20 \
                          --sequence) > "$out/mergeseq_${preset}_$tree.txt" 2>&1 || exit $?
                      echo "$preset, merge on the $tree rows:"; grep -E "^== |^  by kernel " "$out/mergeseq_${preset}_$tree.txt"
                  done
              done ;;
    row1) row=$(no_batch1_row_copy) || exit 1
          for preset in qwen3-32b llama3.1-8b; do
              for tree in table row128; do  # not decode_*.json: part 2 writes the Qwen3-32B cell
                  (cd "$([ $tree = table ] && pwd || echo "$row")" && "${decode[@]}" --presets $preset --forms engine \
                      --batches 1 --interleave 2 --json "$out/row1_${preset}_$tree.json") || exit $?
              done
          done ;;
    tokens1) row=$(no_batch1_row_copy) || exit 1
             for tree in table row128; do  # not decode_*.json: no target counts steps of several tokens
                 (cd "$([ $tree = table ] && pwd || echo "$row")" && "${decode[@]}" --presets llama3.1-8b,qwen3-8b \
                     --forms engine --batches 1 --tokens 4 --layers 16 --interleave 2 \
                     --json "$out/tokens1_$tree.json") || exit $?
             done ;;
    targets) ;;
    *) echo "usage: bash benchmarks/issue7.sh 1|2|3|4|5|6|7|split|verify|gqa|tokens|rope|rope32b|plain|rows|rows64|bounds|llama64|visible|fewer|ropewide|sequence|cold|instep|mergerows|mergeseq|row1|tokens1|targets" >&2; exit 2 ;;
esac
rc=$?
inputs=()
decode_files=("$out"/decode_*.json)
[ -e "${decode_files[0]}" ] && inputs+=(--decode "${decode_files[@]}")
[ -e "$out/kernels.csv" ] && inputs+=(--kernels "$out/kernels.csv")
[ -e "$out/gemm.json" ] && inputs+=(--gemm "$out/gemm.json")
if [ ${#inputs[@]} -eq 0 ]; then
    echo "no decode_*.json, kernels.csv or gemm.json under $out" >&2
    [ "$1" = targets ] && exit 1
    exit $rc
fi
python benchmarks/issue7_targets.py "${inputs[@]}" || rc=$?
exit $rc
