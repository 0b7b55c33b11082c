#!/usr/bin/env bash
# Wheels for bench/gpu_check.sh on a GPU machine whose python3 (3.12) has torch, numba, scipy,
# pyarrow, pytest and hypothesis but not this project's other imports. Run HERE (a machine that
# reaches the package registry), from the repository root; then carry .whl to the GPU machine
# (the device tool's carry: [".whl"]). .whl ignores itself, so nothing of it is ever committed.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
[ -x "$PY" ] || PY=python3
mkdir -p .whl
echo '*' > .whl/.gitignore
# the versions this venv resolved, so the GPU run imports what the tests here ran against
PINS=$("$PY" - <<'PYEOF'
from importlib.metadata import version
for name in ("pydantic", "pydantic-core", "annotated-types", "typing-inspection", "orjson", "zstandard"):
    print(f"{name}=={version(name)}")
PYEOF
)
# shellcheck disable=SC2086
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d .whl $PINS
ls -la .whl
