#!/usr/bin/env bash
# One short device check (run through the workplace's device tool on a GPU machine):
# the CUDA-parametrized tests, then the bench on the GPU. Writes logs under $OUT.
set -o pipefail
OUT=${OUT:-/tmp/gpu_out}; mkdir -p "$OUT"
nvidia-smi -L 2>&1 | tee "$OUT/env.txt"
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.cuda.is_available())" 2>&1 | tee -a "$OUT/env.txt"
timeout 300 python3 -m pytest -q -p no:warnings -p no:cacheprovider -k cuda test_minibpd.py tests/decoders/test_refine.py tests/runtime/test_sampling.py 2>&1 | tee "$OUT/pytest_cuda.txt" | tail -5
timeout 200 python3 minibpd.py --bench --json --device cuda --prompts 16 --new-tokens 128 > "$OUT/bench_cuda.json" 2> "$OUT/bench_cuda.err"
echo "bench rc=$?"; python3 -c "
import json; r = json.load(open('$OUT/bench_cuda.json'))
for k in ('block_efficiency', 'identical_to_greedy', 'tokens_per_s', 'speedup_vs_greedy'): print(k, {a: round(b, 3) if isinstance(b, float) else b for a, b in r[k].items()})
" 2>&1 | tee "$OUT/bench_summary.txt"
