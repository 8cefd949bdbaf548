#!/usr/bin/env bash
# A second, short GPU run after fixes (docs/benchmarks.md, "The first GPU run"): the correctness smoke again,
# the GEMM path's cuBLAS dW adds and LM-head-sized exactness (tests/grpo_kernels/test_gpu.py), the Triton
# backend's own check (benchmarks/triton_check.py: exactness against float64 and S1 timings), then each headline
# path's kernels under torch.profiler at S1 (`auto` and the Hopper recipe, `triton_tma`, among them), then `auto` against TRL's head (time and peak extra memory) at S1-S3
# for the four operations (token-level, sequence-level, frozen head, no-grad log-probs; issue 35). Everything goes
# under $OUT:
#   $OUT/smoke.log, $OUT/gpu-tests.log, $OUT/triton-check.log, $OUT/profile-s1.md, $OUT/auto-vs-trl/ (its JSON),
#   $OUT/auto-vs-trl.md, $OUT/tile-sweep.log (the persistent forward's tiles and pipeline, last), $OUT/env.txt
# Usage (repository root; peers' wheels in .whl/ as docs/benchmarks.md prepares them):
#   OUT=... COMMIT=$(git rev-parse HEAD) bash scripts/gpu_check_run.sh [TRITON_TIMEOUT_S] [PROFILE_TIMEOUT_S] \
#       [AUTO_VS_TRL_BUDGET_S] [SWEEP_TIMEOUT_S]
set -u
TRITON_TIMEOUT_S=${1:-240}  # (a) and (b) took 13 s on the second run; (c), 18 cases at S1-S3, has not run yet
PROFILE_TIMEOUT_S=${2:-150}
AUTO_VS_TRL_BUDGET_S=${3:-180}
SWEEP_TIMEOUT_S=${4:-150}  # the persistent forward's tiles (triton_check (d)): six variants at S1-S3; 0 skips it
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/env.txt"; }
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
{
    echo "commit: ${COMMIT:-unknown}"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
    python3 -c "import sys, torch, triton; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"
} >> "$OUT/env.txt" 2>&1

stamp "smoke: python3 -m pytest -m gpu tests/benchmarks/test_gpu_smoke.py -q -rs --timeout=60"
timeout 90 python3 -m pytest -m gpu tests/benchmarks/test_gpu_smoke.py -q -rs --tb=short -p no:cacheprovider \
    --timeout=60 > "$OUT/smoke.log" 2>&1
stamp "smoke exit $?: $(tail -n 1 "$OUT/smoke.log")"

stamp "cuBLAS dW adds: python3 -m pytest -m gpu tests/grpo_kernels/test_gpu.py -k 'cublas or lm_head_sized' -q"
timeout 240 python3 -m pytest -m gpu tests/grpo_kernels/test_gpu.py -k "cublas or lm_head_sized" -q -rs --tb=short \
    -p no:cacheprovider > "$OUT/gpu-tests.log" 2>&1
stamp "gpu tests exit $?: $(tail -n 1 "$OUT/gpu-tests.log")"

if [ -f benchmarks/triton_check.py ]; then
    stamp "triton: python3 -m benchmarks.triton_check (limit ${TRITON_TIMEOUT_S} s)"
    timeout "$TRITON_TIMEOUT_S" python3 -m benchmarks.triton_check > "$OUT/triton-check.log" 2>&1
    stamp "triton exit $?"
fi

stamp "profile: python3 -m benchmarks.gpu.profile --shape S1 --paths floor,auto,gemm,trl,cce,triton_tma,triton,triton_atomic (limit ${PROFILE_TIMEOUT_S} s)"
timeout "$PROFILE_TIMEOUT_S" python3 -m benchmarks.gpu.profile --shape S1 --paths floor,auto,gemm,trl,cce,triton_tma,triton,triton_atomic \
    --operations logprobs,loss --steps 3 --out "$OUT/profile-s1.md" > "$OUT/profile.log" 2>&1
stamp "profile exit $?"

stamp "auto vs TRL: python3 -m benchmarks.gpu --paths auto,trl --skip-tests (budget ${AUTO_VS_TRL_BUDGET_S} s)"
timeout $(( AUTO_VS_TRL_BUDGET_S + 60 )) python3 -m benchmarks.gpu --out "$OUT/auto-vs-trl" --paths auto,trl --skip-tests \
    --budget-s "$AUTO_VS_TRL_BUDGET_S" ${COMMIT:+--commit "$COMMIT"} > "$OUT/auto-vs-trl.log" 2>&1
stamp "auto vs TRL exit $?: $(tail -n 1 "$OUT/auto-vs-trl.log")"
cat "$OUT"/auto-vs-trl/*.md > "$OUT/auto-vs-trl.md" 2>> "$OUT/auto-vs-trl.log"  # the run's report, as it writes it

if [ "$SWEEP_TIMEOUT_S" -gt 0 ]; then
    stamp "tile sweep: python3 -m benchmarks.triton_check --parts d (limit ${SWEEP_TIMEOUT_S} s)"
    timeout "$SWEEP_TIMEOUT_S" python3 -m benchmarks.triton_check --parts d > "$OUT/tile-sweep.log" 2>&1
    stamp "tile sweep exit $?"
fi
tail -n 30 "$OUT/smoke.log"
tail -n 40 "$OUT/triton-check.log" 2>/dev/null
tail -n 25 "$OUT/tile-sweep.log" 2>/dev/null
cat "$OUT/auto-vs-trl.md" 2>/dev/null
cat "$OUT/env.txt"
