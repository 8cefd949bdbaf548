#!/usr/bin/env bash
# The first-GPU-run sequence in one command for a lent GPU machine (docs/benchmarks.md, "A first run"):
# the correctness smoke and the headline (python -m benchmarks.gpu, one part), the rest of `pytest -m gpu`,
# then the engine's GPU smoke (the built-in demo on cuda, sdpa, one process). Everything it measures goes
# under $OUT (at most 8 files come back from a lent machine):
#   $OUT/env.txt                      device, driver, versions, the commands run
#   $OUT/gpu/                         benchmarks.gpu's four files (progress, tests log, JSON, report)
#   $OUT/pytest-gpu.log               `pytest -m gpu tests/` (the smoke excluded: benchmarks.gpu ran it)
#   $OUT/engine/train.log, metrics.jsonl
# Usage (repository root, wheels of the peers in .whl/ as docs/benchmarks.md prepares them):
#   OUT=... COMMIT=$(git rev-parse HEAD) bash scripts/gpu_first_run.sh [BENCH_BUDGET_S] [TESTS_TIMEOUT_S] [ENGINE_TIMEOUT_S]
set -u
BENCH_BUDGET_S=${1:-240}
TESTS_TIMEOUT_S=${2:-120}
ENGINE_TIMEOUT_S=${3:-90}
COMMIT=${COMMIT:-unknown}
export PYTHONUNBUFFERED=1
mkdir -p "$OUT/gpu" "$OUT/engine"
started=$(date +%s)
stamp() { echo "[$(( $(date +%s) - started )) s] $*" | tee -a "$OUT/env.txt"; }

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        && export PYTHONPATH=/tmp/site
fi
{
    echo "commit: $COMMIT"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm,power.limit --format=csv
    python3 - <<'EOF'
import importlib, platform, torch
print("python", platform.python_version(), "| torch", torch.__version__, "| cuda", torch.version.cuda)
p = torch.cuda.get_device_properties(0)
print("device", p.name, "cc", f"{p.major}.{p.minor}", "SMs", p.multi_processor_count, "memory GiB", round(p.total_memory / 2**30, 1))
for name in ("triton", "transformers", "accelerate", "numpy", "liger_kernel", "cut_cross_entropy", "trl", "datasets"):
    try:
        module = importlib.import_module(name)
        print(name, getattr(module, "__version__", "?"))
    except Exception as error:  # noqa: BLE001
        print(name, "not importable:", type(error).__name__)
EOF
} >> "$OUT/env.txt" 2>&1

stamp "benchmarks.gpu: python3 -m benchmarks.gpu --out \$OUT/gpu --budget-s $BENCH_BUDGET_S --commit $COMMIT"
timeout $(( BENCH_BUDGET_S + 60 )) python3 -m benchmarks.gpu --out "$OUT/gpu" --budget-s "$BENCH_BUDGET_S" --commit "$COMMIT"
stamp "benchmarks.gpu exit $?"

stamp "pytest: python3 -m pytest -m gpu tests/ --ignore=tests/benchmarks/test_gpu_smoke.py -q -rs --timeout=60 (limit ${TESTS_TIMEOUT_S} s)"
timeout "$TESTS_TIMEOUT_S" python3 -m pytest -m gpu tests/ --ignore=tests/benchmarks/test_gpu_smoke.py -q -rs \
    --tb=short -p no:cacheprovider --timeout=60 > "$OUT/pytest-gpu.log" 2>&1
stamp "pytest exit $?: $(tail -n 1 "$OUT/pytest-gpu.log")"

stamp "engine: python3 -m grpo_engine train --max-steps 10 --output-dir /tmp/engine-run --model.attn_implementation sdpa (limit ${ENGINE_TIMEOUT_S} s)"
timeout "$ENGINE_TIMEOUT_S" python3 -m grpo_engine train --max-steps 10 --output-dir /tmp/engine-run \
    --model.attn_implementation sdpa > "$OUT/engine/train.log" 2>&1
stamp "engine exit $?"
cp /tmp/engine-run/metrics.jsonl "$OUT/engine/" 2>/dev/null
tail -n 25 "$OUT/pytest-gpu.log"
tail -n 8 "$OUT/engine/train.log"
cat "$OUT/gpu/"*.md 2>/dev/null | head -n 60
cat "$OUT/env.txt"
