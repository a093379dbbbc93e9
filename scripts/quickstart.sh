#!/usr/bin/env bash
# Quickstart: train a small `balanced` drafter on the default target (SmolLM2-135M-Instruct) on CPU,
# with 2 DeepSpeed ranks (gloo), in a few minutes. The checkpoint goes to runs/quickstart.
#   bash scripts/quickstart.sh [extra train_drafter.py flags, e.g. --max-steps 20]
set -euo pipefail
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}" HF_DATASETS_OFFLINE="${HF_DATASETS_OFFLINE:-1}"
export WANDB_MODE="${WANDB_MODE:-offline}" TOKENIZERS_PARALLELISM=false
export TAPS_DATA_DIR="${TAPS_DATA_DIR:-$(cd .. && pwd)/shared/data}"
if [ ! -d "$TAPS_DATA_DIR" ]; then
  echo "TAPS_DATA_DIR=$TAPS_DATA_DIR does not exist: point it at the offline data directory" >&2
  exit 2
fi
OUT=runs/quickstart
RANKS="${RANKS:-2}"
# a free rendezvous port (29500, DeepSpeed's default, may be taken by another job)
PORT="${MASTER_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}"
resume=()
if [ -d "$OUT/checkpoints" ]; then resume=(--resume auto); fi
deepspeed --num_gpus "$RANKS" --master_port "$PORT" launch/train_drafter.py --name quickstart --output-dir "$OUT" \
  --mix balanced --scale 0.01 --max-steps 50 --eval-every 50 --save-every 25 "${resume[@]}" "$@"
echo
echo "drafter checkpoint: $(pwd)/$OUT (config.json, model.safetensors)"
echo "held-out metrics:   $(pwd)/$OUT/metrics.json"
python3 - "$OUT/metrics.json" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
u, t = m.get("untrained", {}), m.get("last", {})
print(f"held-out EAL: untrained {u.get('eal', float('nan')):.4f} -> trained {t.get('eal', float('nan')):.4f}; "
      f"top-1 per depth {[round(x, 3) for x in t.get('top1_per_depth', [])]}")
PY
