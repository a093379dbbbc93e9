"""Weight-average drafters trained against the same target (or LoRA adapters of one base drafter).

    python launch/merge_drafters.py A B [C ...] --weights 0.5,0.5 --out DIR
    python launch/merge_drafters.py ADAPTER_A ADAPTER_B --base BASE_DRAFTER --out DIR [--merge-into-base]

Drafters are directories or Hub ids. Weights are normalised to sum to one (default: uniform).
Mixed targets or architectures are refused; parents without a shared recorded initialisation
are merged with a warning. The parents and weights are recorded in the config's ``lineage``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("parents", nargs="+", help="drafter directories / Hub ids (or peft adapter dirs)")
    parser.add_argument("--weights", help="comma-separated weights, one per parent (default: uniform)")
    parser.add_argument("--out", required=True, help="output directory (written atomically)")
    parser.add_argument("--base", help="base drafter of LoRA adapter parents (default: the one they record)")
    parser.add_argument("--merge-into-base", action="store_true",
                        help="LoRA: write a plain drafter with the merged adapter folded into the base")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    from checkpoints.averaging import average_drafters, average_lora_dirs, is_lora_dir

    weights = None
    if args.weights:
        try:
            weights = [float(w) for w in args.weights.split(",")]
        except ValueError:
            parser.error(f"--weights must be comma-separated numbers, got {args.weights!r}")
    lora = [is_lora_dir(p) for p in args.parents]
    if any(lora):
        if not all(lora):
            parser.error("mix of LoRA adapter directories and full drafters; merge one kind at a time")
        out = average_lora_dirs(args.base, args.parents, weights, args.out, merge_into_base=args.merge_into_base)
    else:
        if len(args.parents) < 2:
            parser.error("give at least two drafters to average")
        average_drafters(args.parents, weights, out=args.out)
        out = args.out
    print(f"merged {len(args.parents)} parents -> {out}")


if __name__ == "__main__":
    main()
