#!/usr/bin/env python3
"""Prepare (and cache) a data mixture: ``python launch/prepare_data.py --mix balanced --scale 0.1``.

Prints the train/held-out counts and the manifest path; ``--show N`` prints N samples with the trained
(loss-masked) spans between the markers shown in the header line.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from data_recipes.masks import show_masked  # noqa: E402
from data_recipes.prepare import prepare_mixture  # noqa: E402
from data_recipes.recipes import ShortfallError, load_recipe_table  # noqa: E402
from data_recipes.records import BadRowError  # noqa: E402
from data_recipes.resolve import SourceNotFoundError  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--recipes", default=None)
    table = load_recipe_table(pre.parse_known_args(argv)[0].recipes)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mix", required=True, choices=sorted(table.recipes), help="recipe from data_recipes/recipes.yaml")
    p.add_argument("--recipes", default=None, help="a recipe table YAML (default: data_recipes/recipes.yaml)")
    p.add_argument("--scale", type=float, default=1.0, help="multiplies every count of the recipe")
    p.add_argument("--seed", type=int, default=table.seed)
    p.add_argument("--target", default=None, help="Hub id or local model dir (default: smollm2-135m-instruct)")
    p.add_argument("--data-dir", default=None, help="data directory laid out like ../shared/data ($TAPS_DATA_DIR)")
    p.add_argument("--source", action="append", default=[], metavar="NAME=PATH",
                   help="explicit local file for a source (JSONL/JSON/Parquet, ShareGPT or messages format)")
    p.add_argument("--out", default=None, help="output directory (default: a keyed directory in the taps cache)")
    p.add_argument("--max-length", type=int, default=2048)
    p.add_argument("--strict", action="store_true", help="any bad row is an error instead of being dropped")
    p.add_argument("--show", type=int, default=0, metavar="N", help="print N samples with trained spans marked")
    p.add_argument("--num-proc", type=int, default=1, help="tokenising worker processes (same result for any value)")
    p.add_argument("--no-cache", action="store_true", help="rebuild even when a cached copy exists")
    p.add_argument("--regenerate", action="store_true", help="replace assistant turns with the target's responses")
    p.add_argument("--regen-batch-size", type=int, default=16, help="prompts per batched generate() call")
    p.add_argument("--regen-max-new-tokens", type=int, default=512)
    p.add_argument("--regen-shard-size", type=int, default=256, help="conversations per resumable shard")
    p.add_argument("--regen-temperature", type=float, default=0.0)
    p.add_argument("--regen-dtype", default="auto",
                   help="target dtype while regenerating: auto (bf16 on capable GPUs, fp32 on CPU), float32, "
                        "bfloat16 (about 2x faster batched generation on CPU)")
    p.add_argument("--cache-features", action="store_true", help="also cache the target's features (training)")
    p.add_argument("--features-dtype", default="auto")
    p.add_argument("-v", "--verbose", action="store_true")
    return p.parse_args(argv)


def _source_paths(items: list[str]) -> dict[str, str]:
    out = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"--source expects NAME=PATH, got {item!r}")
        out[name] = path
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=logging.DEBUG if args.verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    from training.target import DEFAULT_TARGET, load_tokenizer

    tokenizer = load_tokenizer(args.target)
    regen = None
    if args.regenerate:
        from data_recipes.regenerate import RegenerateConfig

        regen = RegenerateConfig(target=args.target or DEFAULT_TARGET, batch_size=args.regen_batch_size,
                                 max_new_tokens=args.regen_max_new_tokens, shard_size=args.regen_shard_size,
                                 temperature=args.regen_temperature, seed=args.seed, dtype=args.regen_dtype,
                                 max_prompt_tokens=args.max_length)
    try:
        mix = prepare_mixture(args.mix, tokenizer=tokenizer, scale=args.scale, seed=args.seed, data_dir=args.data_dir,
                              max_length=args.max_length, out_dir=args.out, strict=args.strict,
                              target_name=args.target or DEFAULT_TARGET, source_paths=_source_paths(args.source),
                              recipes_file=args.recipes,
                              regenerate=regen, use_cache=not args.no_cache,
                              num_proc=args.num_proc)
    except (ShortfallError, SourceNotFoundError, BadRowError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    m = mix.manifest
    print(f"mixture {m['recipe']} (scale {m['scale']:g}, seed {m['seed']}){' [cached]' if mix.cache_hit else ''}")
    for split in ("train", "heldout"):
        c = m[split]
        print(f"  {split:8s} {c['total']:7,d} rows  by domain {c['by_domain']}  by source {c['by_source']}  "
              f"tokens {c['tokens']:,} (trained {c['trained_tokens']:,})")
    print(f"  dropped  {m['dropped']}")
    print(f"  train hash {m['train_hash']}")
    print(f"manifest: {mix.manifest_path}")
    if args.show:
        print("\ntrained spans are between \u27e6 and \u27e7")
        for row in mix.train.select(range(min(args.show, len(mix.train)))):
            print(f"\n===== {row['id']} ({row['domain']}, {len(row['input_ids'])} tokens) =====")
            print(show_masked(tokenizer, row["input_ids"], row["loss_mask"]))
    if args.cache_features:
        try:
            features = importlib.import_module("data_recipes.features")
            cache_features = features.cache_features
        except (ImportError, AttributeError) as err:
            print(f"error: --cache-features needs data_recipes.features.cache_features ({err})", file=sys.stderr)
            return 2
        path = cache_features(mix.directory, target=args.target or DEFAULT_TARGET, dtype=args.features_dtype)
        print(f"features: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
