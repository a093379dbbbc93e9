#!/usr/bin/env python3
"""Throughput of data preparation: rows/s for a mixture, cold (everything rebuilt) and warm (cache hit).

    python benchmarks/bench_data.py --mix balanced --scale 0.1 --data-dir ../shared/data

Cold = load + validate sources, select rows, render templates, tokenise, find masks, write Arrow.
Warm = the same call again, answered from the cache. Prints a table (Markdown).
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_recipes.prepare import prepare_mixture  # noqa: E402
from data_recipes.sources import load_source  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mix", default="balanced")
    p.add_argument("--scale", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--target", default=None)
    p.add_argument("--data-dir", default=None)
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--warm-repeats", type=int, default=3)
    p.add_argument("--num-proc", type=int, default=1)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    from training.target import load_tokenizer

    tokenizer = load_tokenizer(args.target)
    rows_table = []
    with tempfile.TemporaryDirectory(prefix="bench-data-") as tmp:
        out = Path(tmp) / "mix"
        t0 = time.perf_counter()
        cold = prepare_mixture(args.mix, tokenizer=tokenizer, scale=args.scale, seed=args.seed, data_dir=args.data_dir,
                               max_length=args.max_length, out_dir=out, use_cache=False, num_proc=args.num_proc)
        cold_s = time.perf_counter() - t0
        rows = len(cold.train) + len(cold.heldout)
        tokens = cold.manifest["train"]["tokens"] + cold.manifest["heldout"]["tokens"]
        rows_table.append(("cold (sources + tokenise + write)", cold_s, rows, tokens))
        warm_times = []
        for _ in range(args.warm_repeats):
            t0 = time.perf_counter()
            warm = prepare_mixture(args.mix, tokenizer=tokenizer, scale=args.scale, seed=args.seed,
                                   data_dir=args.data_dir, max_length=args.max_length, out_dir=out)
            warm_times.append(time.perf_counter() - t0)
            assert warm.cache_hit and warm.manifest["train_hash"] == cold.manifest["train_hash"]
        rows_table.append((f"warm (cache hit, best of {args.warm_repeats})", min(warm_times), rows, tokens))
        load_s = 0.0
        for names in ({s for d in cold.manifest["domains"].values() for s in d["used_sources"]},):
            for name in sorted(names):
                t0 = time.perf_counter()
                load_source(name, data_dir=args.data_dir)
                load_s += time.perf_counter() - t0
        rows_table.append(("  of cold: loading + validating sources", load_s, None, None))
    print(f"\nmixture {args.mix} scale {args.scale:g}, tokenizer {tokenizer.name_or_path}, max length {args.max_length}, "
          f"{args.num_proc} tokenising process(es), "
          f"train hash {cold.manifest['train_hash'][:19]}")
    print("| phase | seconds | rows | rows/s | tokens/s |")
    print("|---|---:|---:|---:|---:|")
    for name, secs, n, toks in rows_table:
        if n is None:
            print(f"| {name} | {secs:.2f} | | | |")
        else:
            print(f"| {name} | {secs:.2f} | {n:,} | {n / secs:,.0f} | {toks / secs:,.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
