#!/usr/bin/env bash
# The test suite on the oldest stack pyproject.toml claims to support, as the GPU machines have it: Python 3.12,
# every lower bound of the core dependencies and of the engine extra installed exactly, numpy 2.5, and none of
# trl, liger-kernel, datasets, math-verify or vLLM (their tests skip with the reason). The test tools (pytest,
# pytest-xdist, pytest-benchmark, hypothesis) come at their newest. CI runs it (.ci/run).
#
#   scripts/test_oldest_stack.sh [pytest arguments]
#   scripts/test_oldest_stack.sh --setup-only     # make or update the environment, check it, run no test
#   scripts/test_oldest_stack.sh --tests-only [pytest arguments]   # check the environment as it is, run the tests
#
# VENV (default .venv-oldest, ignored by git) is created if missing and reused otherwise. torch's PyPI wheel is
# a CUDA build (it also runs on a CPU): the environment takes about 5 GB and installs in about 75 s here.
set -euo pipefail
cd "$(dirname "$0")/.."
setup=true
tests=true
case "${1:-}" in
    --setup-only) tests=false; shift ;;
    --tests-only) setup=false; shift ;;
esac
if [ -z "${PYTHON:-}" ]; then   # a python3.12 that runs (a pyenv shim may exist without the version selected)
    for candidate in python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python; do
        if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" >/dev/null 2>&1; then
            PYTHON=$candidate
            break
        fi
    done
fi
if [ -z "${PYTHON:-}" ] || ! "$PYTHON" -c "import sys; sys.exit(sys.version_info[:2] != (3, 12))" >/dev/null 2>&1; then
    echo "test_oldest_stack.sh: needs Python 3.12 (set PYTHON=/path/to/python3.12); got '${PYTHON:-none}'" >&2
    exit 2
fi
VENV=${VENV:-.venv-oldest}
EXTRAS=${EXTRAS:-engine}   # the extras whose floors are pinned and installed (not trl: the GPU machines lack it)

if $setup; then
    [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
    constraints="$VENV/oldest-stack-constraints.txt"
    EXTRAS="$EXTRAS" "$VENV/bin/python" - >"$constraints" <<'PY'
import os
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
requirements = list(project["dependencies"])
for extra in os.environ["EXTRAS"].split(","):
    requirements += extras[extra]
pins = {}
for requirement in requirements:
    floor = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+)", requirement)
    if floor:
        pins[floor[1]] = floor[2]
pins["numpy"] = "2.5.*"
# matplotlib's floor with the pyparsing of its time: pyparsing 3.3 deprecates the names matplotlib 3.9 calls
pins["pyparsing"] = "3.1.*"
print("\n".join(f"{name}=={version}" for name, version in pins.items()))
PY
    echo "oldest stack: $(tr '\n' ' ' <"$constraints")"
    "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e ".[$EXTRAS]" \
        "pytest>=8" "pytest-xdist>=3" "pytest-benchmark>=4" "hypothesis>=6"
elif [ ! -x "$VENV/bin/python" ]; then
    echo "test_oldest_stack.sh: --tests-only needs the environment $VENV; make it with --setup-only" >&2
    exit 2
fi
"$VENV/bin/python" -m pip check
"$VENV/bin/python" -c "import sys, torch, triton, transformers, accelerate, numpy
print('Python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__,
      'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'numpy', numpy.__version__)"
for absent in trl liger_kernel datasets math_verify vllm; do
    if "$VENV/bin/python" -c "import importlib.util, sys; sys.exit(importlib.util.find_spec('$absent') is None)"; then
        echo "test_oldest_stack.sh: $absent is installed in $VENV, but the GPU machines' stack has none" >&2
        exit 2
    fi
done
if ! $tests; then
    exit 0
fi
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
