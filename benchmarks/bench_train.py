"""Training throughput with online vs offline (cached) target features, and peak memory.

    python benchmarks/bench_train.py --steps 6 --scale 0.01

Each mode runs in its own process (one rank, ZeRO-2, the default target, the balanced mixture)
so the peak memory figures are separate. The first step is a warm-up and is not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def run_mode(mode: str, args) -> dict:
    import torch

    from training.config import TrainConfig
    from training.lifecycle import check_chat_template, load_data, load_frozen_target
    from training.trainer import Trainer

    out = Path(tempfile.mkdtemp(prefix=f"bench-train-{mode}-"))
    cfg = TrainConfig(name="bench", output_dir=str(out / "run"), mix=args.mix, scale=args.scale,
                      max_steps=args.steps, tokens_per_batch=args.tokens_per_batch, objective=args.objective,
                      features=mode, eval_at_start=False, max_length=args.max_length)
    target, tokenizer = load_frozen_target(cfg)
    check_chat_template(tokenizer, cfg)
    data = load_data(cfg, tokenizer)
    cache_s = 0.0
    if mode == "offline":
        from data_recipes.features import cache_features

        cfg.feature_dir = str(out / "features")
        started = time.perf_counter()
        rows = [data.train[i] for i in range(min(len(data.train), args.steps * 8))] + list(data.heldout)
        cache_features(data.directory, target=target, out_dir=cfg.feature_dir, rows=rows, progress=False)
        cache_s = time.perf_counter() - started
        data.train = data.train.select(range(min(len(data.train), args.steps * 8)))
    trainer = Trainer(cfg, target=target, data=data)
    batches = trainer.stream.micro_batches(0)
    trainer._optimizer_step(batches)  # warm-up
    tokens0, started = trainer.tokens, time.perf_counter()
    for _ in range(args.steps - 1):
        trainer._optimizer_step(batches)
    elapsed = time.perf_counter() - started
    peak_gpu = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
    return {"mode": mode, "device": str(trainer.device), "tokens_per_s": (trainer.tokens - tokens0) / elapsed,
            "s_per_step": elapsed / (args.steps - 1), "peak_rss_gib": resource.getrusage(
                resource.RUSAGE_SELF).ru_maxrss / 2**20, "peak_gpu_gib": peak_gpu, "cache_s": cache_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=6, help="optimizer steps per mode (first is warm-up)")
    parser.add_argument("--mix", default="balanced", help="data mixture")
    parser.add_argument("--scale", type=float, default=0.01, help="mixture scale")
    parser.add_argument("--tokens-per-batch", type=int, default=1024, help="tokens per micro-batch")
    parser.add_argument("--max-length", type=int, default=512, help="maximum row length")
    parser.add_argument("--objective", default="hass", choices=["hass", "eagle"], help="objective")
    parser.add_argument("--modes", default="online,offline", help="comma-separated modes to run")
    parser.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # internal: one mode, JSON out
    args = parser.parse_args()
    if args.mode:
        print("RESULT " + json.dumps(run_mode(args.mode, args)), flush=True)
        return
    rows = []
    for mode in args.modes.split(","):
        cmd = [sys.executable, __file__, "--mode", mode] + sys.argv[1:]
        proc = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ})
        line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
        if proc.returncode or not line:
            print(proc.stdout[-2000:], proc.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"mode {mode} failed")
        rows.append(json.loads(line[0][7:]))
    print(f"\nbench_train: {args.objective}, {args.tokens_per_batch} tokens/micro-batch, 1 rank, "
          f"{args.steps - 1} timed steps")
    print("| features | device | tokens/s | s/step | peak RSS GiB | peak GPU GiB | feature caching s |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        gpu = "-" if r["peak_gpu_gib"] is None else f"{r['peak_gpu_gib']:.2f}"
        print(f"| {r['mode']} | {r['device']} | {r['tokens_per_s']:.0f} | {r['s_per_step']:.2f} | "
              f"{r['peak_rss_gib']:.2f} | {gpu} | {r['cache_s']:.1f} |")


if __name__ == "__main__":
    main()
