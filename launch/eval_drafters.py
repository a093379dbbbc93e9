"""Evaluate drafters: the whole grid (drafters/strategies x benchmarks x rules x temperatures), resumable.

    python launch/eval_drafters.py --drafters math=DIR,chat=DIR --benchmarks gsm8k,mt_bench \\
        --rules sps --temperatures 0,1 --strategies single,route-confidence,merge-trie --limit 5 \\
        --max-new-tokens 128 --output-dir results/NAME
    torchrun --nproc_per_node 2 launch/eval_drafters.py ...   (or: deepspeed --num_gpus 2 ...)

Writes results/NAME/results.jsonl (one line per prompt and turn), cells/ (resume state) and, unless
--no-report, report.md with plots. See docs/evaluation.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.grid import BENCHMARKS, RULES, STRATEGIES, GridSpec, parse_drafters, parse_list  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", default=None, help="Hub id or directory (default: smollm2-135m-instruct)")
    p.add_argument("--drafters", required=True, help="DIR or name=DIR,name=DIR,...")
    p.add_argument("--benchmarks", default="gsm8k", help=f"comma list of {','.join(BENCHMARKS)}")
    p.add_argument("--rules", default="sps", help=f"comma list of {','.join(RULES)}")
    p.add_argument("--deltas", default="1.0", help="Cactus delta values (comma list)")
    p.add_argument("--strategies", default="single", help=f"comma list of {','.join(STRATEGIES)}")
    p.add_argument("--temperatures", default="0", help="comma list (0 = greedy)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=0)
    p.add_argument("--limit", type=int, default=None, help="first N prompts of each benchmark")
    p.add_argument("--max-new-tokens", type=int, default=1024)
    p.add_argument("--draft-shape", default=None, help="chain:K or tree:TOTAL,DEPTH,TOPK (default: the engine's)")
    p.add_argument("--draft-vocab", type=int, default=0, metavar="N",
                   help="drafters propose from their N most-trained tokens only (FR-Spec; lossless, cheaper "
                        "drafting on small targets; 0 = full vocabulary)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float64"])
    p.add_argument("--output-dir", default="results/eval")
    p.add_argument("--pair", default=None, help="the two specialists MATH,CHAT (default: drafters named math,chat)")
    p.add_argument("--average-alpha", type=float, default=0.5, help="weight of the math specialist in 'average'")
    p.add_argument("--no-plain", action="store_true", help="skip the plain-decoding baseline (no speedups)")
    p.add_argument("--no-drift", action="store_true", help="skip the target log-likelihood of outputs")
    p.add_argument("--no-report", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default=None, help="offline data (default: $TAPS_DATA_DIR)")
    p.add_argument("--local_rank", "--local-rank", type=int, default=None, help=argparse.SUPPRESS)  # deepspeed
    return p


def spec_from_args(args: argparse.Namespace) -> GridSpec:
    return GridSpec(
        drafters=parse_drafters(args.drafters), benchmarks=parse_list(args.benchmarks),
        rules=parse_list(args.rules), deltas=parse_list(args.deltas, float),
        strategies=parse_list(args.strategies), temperatures=parse_list(args.temperatures, float),
        target=args.target, top_p=args.top_p, top_k=args.top_k, limit=args.limit,
        max_new_tokens=args.max_new_tokens, draft_shape=args.draft_shape, dtype=args.dtype,
        draft_vocab=args.draft_vocab or None,
        output_dir=args.output_dir, pair=tuple(parse_list(args.pair)) if args.pair else None,
        average_alpha=args.average_alpha, plain=not args.no_plain, seed=args.seed, data_dir=args.data_dir)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        spec = spec_from_args(args)
    except ValueError as err:
        build_parser().error(str(err))
    from eval.grid_runner import finish_distributed, init_distributed, print_summary, run_grid

    try:
        store = run_grid(spec, progress=not args.no_progress, drift=not args.no_drift)
        if init_distributed().rank == 0:
            print_summary(store, spec)
            if not args.no_report:
                from eval.report import write_report

                print(f"report: {write_report(spec.output_dir)}")
    finally:
        finish_distributed()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
