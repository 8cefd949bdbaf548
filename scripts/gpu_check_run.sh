#!/usr/bin/env bash
# The next GPU run in one device command (issue 36; docs/benchmarks.md, "The first GPU run" for how results are
# committed): every step below in priority order, each under its own cap and all under one deadline, so the whole
# fits one `run` of at most 10 minutes with the session's 15 minutes of device time (a machine's start included).
# A step the deadline leaves no time for is written as not run in env.txt, never dropped silently.
#   smoke     the correctness smoke against float64 on the GPU, every backend, both dtypes
#   engine    the engine's GPU smoke: the built-in demo on cuda for 10 steps (bf16 weights, so AdamW over float32
#             master copies: its first CUDA run), sdpa, one process
#   triton    benchmarks.triton_check: the Triton paths against float64, then their times at S1-S3
#   autotrl   `auto` against TRL's head (time and peak extra memory) at S1-S3, the four operations (issue 35)
#   profile   each headline path's kernels under torch.profiler at S1 (`auto`, the Hopper recipe `triton_tma`, ...)
#   sweep     the persistent forward's tiles and pipeline (triton_check --parts d)
#   gputests  the cuBLAS dW adds and the LM-head-sized exactness of `pytest -m gpu`
# At most 8 files come back from a lent machine, so the logs are written to $WORK and packed after every step into
# $OUT/run.tgz (what a killed command left comes back too), beside $OUT/env.txt and $OUT/summary.txt.
# Usage (repository root; peers' wheels in .whl/ as docs/benchmarks.md prepares them, carried):
#   OUT=... COMMIT=$(git rev-parse HEAD) bash scripts/gpu_check_run.sh [DEADLINE_S] [PARTS]
# DEADLINE_S: seconds from the start by which every step has ended (default 540: a 600 s `run` with room to pack);
# PARTS: a comma-separated subset of the steps above, run in the order above (default: all).
set -u
DEADLINE_S=${1:-540}
PARTS=${2:-smoke,engine,triton,autotrl,profile,sweep,gputests}
WORK=${WORK:-/tmp/gpu-check}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT" "$WORK"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/env.txt"; }
pack() { tar czf "$OUT/run.tgz.partial" -C "$WORK" . 2>/dev/null && mv "$OUT/run.tgz.partial" "$OUT/run.tgz"; }
wanted() { case ",$PARTS," in *",$1,"*) return 0 ;; *) return 1 ;; esac; }
# step NAME CAP_S COMMAND...: runs COMMAND (its output to $WORK/NAME.log) for at most CAP_S seconds and at most until
# the deadline less 15 s (for packing); a step not asked for, or without 20 s left, is said and skipped.
step() {
    local name=$1 cap=$2
    shift 2
    wanted "$name" || return 0
    local left=$(( DEADLINE_S - ($(date +%s) - started) - 15 ))
    local limit=$(( cap < left ? cap : left ))
    if [ "$limit" -lt 20 ]; then
        stamp "$name: not run (${left} s left before the deadline)"
        echo "$name: not run" >> "$OUT/summary.txt"
        return 0
    fi
    stamp "$name (limit ${limit} s): $*"
    timeout "$limit" "$@" > "$WORK/$name.log" 2>&1
    local code=$?
    stamp "$name exit $code: $(tail -n 1 "$WORK/$name.log")"
    echo "$name exit $code: $(tail -n 1 "$WORK/$name.log")" >> "$OUT/summary.txt"
    pack
}

# pytest-timeout's per-test limit where the plugin is installed (the GPU machines have it; a CPU check may not)
PER_TEST_LIMIT=$(python3 -c "import pytest_timeout" 2>/dev/null && echo "--timeout=60")
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
{
    echo "commit: ${COMMIT:-unknown}"
    echo "parts: $PARTS; deadline ${DEADLINE_S} s"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
    python3 -c "import trl, liger_kernel, cut_cross_entropy; print('trl', trl.__version__)" 2>&1 | tail -n 1
} >> "$OUT/env.txt" 2>&1

step smoke 90 python3 -m pytest -m gpu tests/benchmarks/test_gpu_smoke.py -q -rs --tb=short -p no:cacheprovider \
    $PER_TEST_LIMIT
step engine 100 python3 -m grpo_engine train --max-steps 10 --output-dir "$WORK/engine-run" \
    --model.attn_implementation sdpa
cp "$WORK/engine-run/metrics.jsonl" "$WORK/engine-metrics.jsonl" 2>/dev/null
step triton 120 python3 -m benchmarks.triton_check
step autotrl 170 python3 -m benchmarks.gpu --out "$WORK/auto-vs-trl" --paths auto,trl --skip-tests --budget-s 140 \
    ${COMMIT:+--commit "$COMMIT"}
step profile 70 python3 -m benchmarks.gpu.profile --shape S1 \
    --paths floor,auto,gemm,trl,cce,triton_tma,triton,triton_atomic --operations logprobs,loss --steps 3 \
    --out "$WORK/profile-s1.md"
step sweep 90 python3 -m benchmarks.triton_check --parts d
step gputests 120 python3 -m pytest -m gpu tests/grpo_kernels/test_gpu.py -k "cublas or lm_head_sized" -q -rs \
    --tb=short -p no:cacheprovider $PER_TEST_LIMIT
pack
cat "$OUT/summary.txt"
tail -n 12 "$WORK/smoke.log" 2>/dev/null
tail -n 6 "$WORK/engine.log" 2>/dev/null
tail -n 30 "$WORK/triton.log" 2>/dev/null
cat "$WORK"/auto-vs-trl/*.md 2>/dev/null | tail -n 40
cat "$OUT/env.txt"
