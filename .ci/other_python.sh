#!/usr/bin/env bash
# The suite on another Python than CI's (pyenv's 3.13 by default): the corpus and stdlib differ
# between versions, and no test may depend on them. Not part of every CI run: only a cp311 CPU
# wheel of torch lies on this project's machines, so on 3.13 `pip install torch==2.13.0` pulls the
# 4.7 GB CUDA build from PyPI (it runs on the CPU all the same).
#   .ci/other_python.sh [VERSION]        # e.g. 3.12.1; default 3.13.0
#   TORCH=2.1.2 NUMPY='numpy<2' .ci/other_python.sh 3.9.18   # the oldest pair we claim (torch
#                                        # before 2.3 was built against numpy 1)
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=${1:-3.13.0}
PY=${PYENV_ROOT:-$HOME/.pyenv}/versions/$VERSION/bin/python
[ -x "$PY" ] || { echo "no Python $VERSION under pyenv ($PY)" >&2; exit 2; }
VENV=${VENV:-/tmp/minibpd-py$VERSION}
[ -d "$VENV" ] || "$PY" -m venv "$VENV"
. "$VENV/bin/activate"
python -m pip install --quiet --upgrade pip
python -m pip install --quiet "torch==${TORCH:-2.13.0}" "${NUMPY:-numpy}"
python -m pip install --quiet -r requirements.txt
python -c "import sys, torch, numpy; print('python', sys.version.split()[0], 'torch', torch.__version__, 'numpy', numpy.__version__)"
python minibpd.py --demo --max-new-tokens 40 > /dev/null
python -m pytest -q -p no:cacheprovider
