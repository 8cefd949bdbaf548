#!/usr/bin/env bash
# The test suite on the oldest stack pyproject.toml claims to support: every lower bound of its dependencies
# (and of the trl, peft and engine extras) installed exactly, on Python 3.12 with the GPU machines' numpy 2.5,
# in a virtual environment of its own, from PyPI. The dev tools (pytest, hypothesis, ...) and the unversioned
# extras (liger-kernel, math-verify, tensorboard) come at their newest.
#
#   PYTHON=python3.12 scripts/test_oldest_stack.sh [pytest arguments]
#
# VENV (default .venv-oldest) is created if missing and reused otherwise. Not run by CI: torch's PyPI wheel
# is a CUDA build (it also runs on a CPU) and the environment takes about 6 GB.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3.12}
VENV=${VENV:-.venv-oldest}

[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV"
constraints="$VENV/oldest-stack-constraints.txt"
"$VENV/bin/python" - >"$constraints" <<'PY'
import re
import tomllib

project = tomllib.load(open("pyproject.toml", "rb"))["project"]
extras = project["optional-dependencies"]
pins = {}
for requirement in project["dependencies"] + extras["trl"] + extras["peft"] + extras["engine"]:
    floor = re.match(r"([A-Za-z0-9_.-]+)\s*>=\s*([^,;\s]+)", requirement)
    if floor:
        pins[floor[1]] = floor[2]
pins["numpy"] = "2.5.*"
print("\n".join(f"{name}=={version}" for name, version in pins.items()))
PY
echo "oldest stack: $(tr '\n' ' ' <"$constraints")"
"$VENV/bin/python" -m pip install --quiet --disable-pip-version-check -c "$constraints" -e ".[dev]"
"$VENV/bin/python" -m pip check
"$VENV/bin/python" -c "import sys, torch, triton, transformers, accelerate, numpy
print('Python', sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__,
      'transformers', transformers.__version__, 'accelerate', accelerate.__version__, 'numpy', numpy.__version__)"
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider "$@"
