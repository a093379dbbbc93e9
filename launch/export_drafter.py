"""Export a taps drafter to the EAGLE layout for serving engines, or import a released EAGLE/HASS drafter.

    python launch/export_drafter.py DRAFTER --format eagle [--engine sglang|vllm|eagle] --out DIR
        [--dtype float16] [--with-bin] [--target TARGET  (adds embed_tokens.weight)]
    python launch/export_drafter.py --import-eagle DIR --target TARGET --out DIR

DRAFTER is a local directory or a Hub id (ORG/NAME[@revision]). See docs/checkpoints.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafter", nargs="?", help="taps drafter directory or Hub id to export")
    parser.add_argument("--format", choices=["eagle"], default="eagle", help="export layout")
    parser.add_argument("--engine", choices=["sglang", "vllm", "eagle"], default="sglang",
                        help="sets config.json architectures for that loader (default sglang)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default=None,
                        help="weights dtype of the export (default: as stored)")
    parser.add_argument("--with-bin", action="store_true",
                        help="also write pytorch_model.bin for old EAGLE loaders that read only the pickle")
    parser.add_argument("--import-eagle", metavar="DIR",
                        help="convert a released EAGLE-1/2 or HASS drafter (pytorch_model.bin) to taps")
    parser.add_argument("--target", help="target model (needed by --import-eagle; with an export it adds "
                                         "the target's embed_tokens.weight)")
    parser.add_argument("--out", required=True, help="output directory (written atomically)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")

    import torch

    from checkpoints.eagle_format import export_eagle, import_eagle, verify_export
    from checkpoints.resolve import resolve_drafter

    if args.import_eagle:
        if args.drafter:
            parser.error("give either DRAFTER (export) or --import-eagle DIR, not both")
        if not args.target:
            parser.error("--import-eagle needs --target (its config fills the drafter configuration)")
        out = import_eagle(args.import_eagle, args.out, target=args.target)
        print(f"imported {args.import_eagle} -> {out}")
        return
    if not args.drafter:
        parser.error("give the drafter to export (or --import-eagle DIR)")
    from checkpoints.drafter_io import load_drafter

    drafter = load_drafter(resolve_drafter(args.drafter))
    embed = None
    if args.target:
        from training.target import FrozenTarget, load_target

        model, _ = load_target(args.target, dtype="float32", device="cpu")
        embed = FrozenTarget(model, args.target).embed_tokens.weight
    dtype = getattr(torch, args.dtype) if args.dtype else None
    out = export_eagle(drafter, args.out, engine=args.engine, dtype=dtype, embed_tokens=embed,
                       write_bin=args.with_bin)
    if dtype is None:
        verify_export(out, drafter)
    print(f"exported {args.drafter} -> {out} (EAGLE layout for {args.engine})")


if __name__ == "__main__":
    main()
