#!/usr/bin/env bash
# The GPU check (docs/gpu.md): on a machine with CUDA and the project installed as the README says
# (there: the machine's own CUDA torch, then `pip install -r requirements.txt && pip install -e .`;
# the real model's packages for its half), one run of
#   1. the whole suite, its CUDA cases on (pytest-xdist's -n, when installed, spreads it over cores);
#   2. the demo on CUDA;
#   3. the bench's JSON on CUDA: the character model in float32 with every decoder (bf16 is refused
#      there: it is not batch-invariant), SmolLM2 in float32 and bf16 with greedy, BPD, lookup and
#      pbest (block efficiency, tokens/s, speedup over greedy, identical to greedy);
#   4. nvidia-smi and the torch / CUDA versions.
# Every output goes to $OUT (default /tmp/gpu_out), 7 files.
#     OUT=/tmp/gpu_out bash tools/gpu_check.sh
set -u
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
{ nvidia-smi; $PY -c "import sys, torch; print('python', sys.version.split()[0], 'torch', torch.__version__,
'cuda', torch.version.cuda, torch.cuda.is_available(), torch.cuda.get_device_name(0))"; nproc; } \
    > "$OUT/env.txt" 2>&1
t0=$(date +%s)
XDIST=$($PY -c "import xdist" 2>/dev/null && echo "-n ${WORKERS:-12}")
timeout "${SUITE_S:-300}" $PY -m pytest -q -p no:cacheprovider $XDIST -rs > "$OUT/pytest.txt" 2>&1
echo "pytest exit $? in $(( $(date +%s) - t0 )) s ($XDIST)" >> "$OUT/pytest.txt"
t0=$(date +%s)
timeout 90 $PY minibpd.py --demo --device cuda > "$OUT/demo.txt" 2>&1
echo "demo exit $? in $(( $(date +%s) - t0 )) s" >> "$OUT/demo.txt"
: > "$OUT/errors.txt"
bench() {   # name, timeout, flags...
    local name=$1 limit=$2; shift 2
    t0=$(date +%s)
    timeout "$limit" $PY minibpd.py --bench --json --device cuda "$@" > "$OUT/$name.json" 2>> "$OUT/errors.txt"
    echo "$name exit $? in $(( $(date +%s) - t0 )) s: $*" >> "$OUT/errors.txt"
}
bench bench_char_float32 150 --dtype float32
SMOL="--checkpoint checkpoints/smollm2-heads.pt --prompts ${SMOL_PROMPTS:-8} --new-tokens 64"
bench bench_smollm_float32 ${SMOL_S:-120} $SMOL --dtype float32 --decoders lookup,pbest
bench bench_smollm_bfloat16 ${SMOL_S:-120} $SMOL --dtype bfloat16 --decoders lookup,pbest
