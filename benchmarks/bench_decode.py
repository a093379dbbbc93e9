"""Decoding speed on the default target: plain (this engine and HF ``generate``), chain and tree
speculative decoding, HF prompt-lookup decoding; engine overhead; a ``--draft-shape`` sweep with each
shape's break-even tau; the Cactus closed form's worst KL / delta.

    python benchmarks/bench_decode.py --prompts 3 --max-new-tokens 48 --dtypes float32,bfloat16 \
        [--drafter DIR] [--draft-shapes chain:2,chain:4,tree:60,5,10] [--device cpu|cuda] [--json out.json]

Speedups are against fp32 HF ``generate`` on the same prompts and machine. Break-even tau = the tau
at which a shape's measured time per pass equals the baseline's time per token (speedup 1).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from eval.acceptance import binary_kl, cactus_gamma_closed, kl, make_rule, node_distribution  # noqa: E402
from eval.engine import build_engine  # noqa: E402
from eval.metrics import pooled_tau  # noqa: E402
from eval.warp import Warp  # noqa: E402

FALLBACK_PROMPTS = [
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. "
    "How many clips did Natalia sell altogether in April and May?",
    "Weng earns $12 an hour for babysitting. Yesterday, she just did 50 minutes of babysitting. How much did she earn?",
    "Betty is saving money for a new wallet which costs $100. Betty has only half of the money she needs. "
    "Her parents decided to give her $15 for that purpose, and her grandparents twice as much as her parents. "
    "How much more money does Betty need to buy the wallet?",
]


def gsm8k_prompts(n: int) -> tuple[list[str], str]:
    try:
        from data_recipes.benchmarks import load_benchmark

        qs = load_benchmark("gsm8k", limit=n)
        return [q.turns[0] for q in qs], "gsm8k"
    except Exception as err:  # data dir missing: the built-in GSM8K examples
        print(f"[bench] GSM8K data unavailable ({err}); using {len(FALLBACK_PROMPTS)} built-in GSM8K questions")
        return FALLBACK_PROMPTS[:n], "builtin-gsm8k"


def encode(tok, text: str, device) -> torch.Tensor:
    rendered = tok.apply_chat_template([{"role": "user", "content": text}], add_generation_prompt=True,
                                       tokenize=False)
    return torch.tensor([tok(rendered, add_special_tokens=False)["input_ids"]], device=device)


def sync(device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_hf(model, prompts, max_new: int, **kw) -> dict:
    tokens, secs = 0, 0.0
    for ids in prompts:
        sync(ids.device)
        t0 = time.perf_counter()
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, pad_token_id=0, **kw)
        sync(ids.device)
        secs += time.perf_counter() - t0
        tokens += out.shape[1] - ids.shape[1]
    return {"tokens": tokens, "seconds": secs, "tok_s": tokens / secs}


def time_engine(model, drafter, shape: str, prompts, max_new: int, draft_vocab: int = 0, counts=None) -> dict:
    eng = build_engine(model, drafter=drafter, shape=shape, rule="greedy", max_new_tokens=max_new,
                       draft_vocab=draft_vocab or None, token_counts=counts)
    recs = [eng.generate(ids, torch.Generator().manual_seed(0)) for ids in prompts]
    tokens = sum(len(r.new_tokens) for r in recs)
    secs = sum(r.wall_s for r in recs)
    decode = sum(r.decode_s for r in recs)
    passes = sum(r.verify_passes for r in recs)
    outside = sum(r.decode_s - r.target_s - r.draft_s for r in recs)
    return {"tokens": tokens, "seconds": secs, "tok_s": tokens / secs, "tau": pooled_tau(recs),
            "passes": passes, "pass_ms": 1e3 * decode / max(passes, 1),
            "target_ms": 1e3 * sum(r.target_s for r in recs) / max(passes, 1),
            "draft_ms": 1e3 * sum(r.draft_s for r in recs) / max(passes, 1),
            "overhead": outside / decode if decode > 0 else float("nan"), "new_tokens": [r.new_tokens for r in recs]}


def cactus_table() -> list[tuple[float, float, str]]:
    q = torch.linspace(1e-6, 1 - 1e-6, 200001, dtype=torch.float64)
    rows = []
    for delta in (0.01, 0.1, 0.5, 0.75, 1.0):
        ratio = binary_kl(cactus_gamma_closed(q, delta), q) / delta
        over = q[ratio > 1 + 1e-9]
        where = f"[{over.min():.3f}, {over.max():.3f}]" if over.numel() else "-"
        rows.append((delta, float(ratio.max()), where))
    return rows


@torch.no_grad()
def cactus_tree_divergence(model, prompts, siblings: int = 10, positions: int = 64) -> list[tuple]:
    """Exact KL(emitted || q) / delta at tree nodes whose children are q's own top ``siblings`` tokens,
    over the target's real distributions (teacher-forced prompt positions; T = 0.6, top-p 0.95 as in
    the Cactus paper): Cactus on the first sibling only (default) vs on every sibling."""
    warp = Warp(0.6, top_p=0.95)
    qs = []
    for ids in prompts:
        logits = model(ids).logits[0, -positions:].float().cpu()
        qs.extend(warp.probs(row) for row in logits)
    rows = []
    for name in ("cactus", "cactus-exact"):
        for delta in (0.5, 1.0):
            for mode in ("first", "all"):
                rule = make_rule(name, warp, delta=delta, cactus_siblings=mode)
                ratios = [kl(node_distribution(rule, q, torch.topk(q, siblings).indices.tolist()), q) / delta
                          for q in qs]
                rows.append((name, delta, mode, sum(ratios) / len(ratios), max(ratios), len(ratios)))
    return rows


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", default=None)
    ap.add_argument("--drafter", default=None, help="drafter directory (default: an UNTRAINED drafter)")
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--dtypes", default="float32,bfloat16")
    ap.add_argument("--draft-shapes", "--draft-shape", default="chain:2,chain:4,tree:10,3,3,tree:60,5,10")
    ap.add_argument("--speculative-dtypes", default=None,
                    help="dtypes that also run the draft shapes (default: every --dtypes entry; the others "
                         "only time generate, prompt lookup and plain decoding)")
    ap.add_argument("--chain", default="chain:4", help="the chain shape of the main table")
    ap.add_argument("--tree", default="tree:60,5,10", help="the tree shape of the main table")
    ap.add_argument("--draft-vocab", default="0",
                    help="comma list of draft vocabulary sizes to sweep (0 = full; needs the drafter's "
                         "token_counts.safetensors), e.g. 0,8192")
    ap.add_argument("--device", default=None)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch default)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--skip-divergence", action="store_true", help="skip the Cactus tree-divergence table")
    args = ap.parse_args(argv)

    from checkpoints.drafter_io import load_drafter
    from checkpoints.token_counts import load_token_counts
    from training.drafter import DrafterConfig, EagleDrafter
    from training.target import FrozenTarget, load_target

    if args.threads:
        torch.set_num_threads(args.threads)
    vocabs = [int(v) for v in args.draft_vocab.split(",") if v.strip()]
    counts = load_token_counts(args.drafter) if args.drafter and any(vocabs) else None
    texts, source = gsm8k_prompts(args.prompts)
    results: dict = {"source": source, "prompts": len(texts), "max_new_tokens": args.max_new_tokens, "rows": []}
    base_tok_s = None
    for dtype in args.dtypes.split(","):
        model, tok = load_target(args.target, dtype=dtype, device=args.device)
        device = next(model.parameters()).device
        frozen = FrozenTarget(model)
        if args.drafter:
            drafter = load_drafter(args.drafter, target=frozen.info(), device=device, dtype=model.dtype)
            dname = args.drafter
        else:
            cfg = DrafterConfig.from_target(model.config, frozen.info(), seed=0)
            drafter = EagleDrafter.from_config(cfg).to(device=device, dtype=model.dtype).eval()
            dname = "UNTRAINED (EagleDrafter.from_config, seed 0): tau ~ 1, shows cost not benefit"
        results["drafter"] = dname
        prompts = [encode(tok, t, device) for t in texts]
        time_hf(model, prompts[:1], 4)  # warm-up
        rows = []
        hf = time_hf(model, prompts, args.max_new_tokens)
        if base_tok_s is None:
            base_tok_s = hf["tok_s"] if dtype in ("float32", "fp32") else None
        rows.append(("HF generate", dtype, hf))
        rows.append(("HF prompt-lookup (10)", dtype, time_hf(model, prompts, args.max_new_tokens,
                                                              prompt_lookup_num_tokens=10)))
        print(f"[bench] {dtype} HF generate {rows[0][2]['tok_s']:.2f} tok/s, prompt-lookup "
              f"{rows[1][2]['tok_s']:.2f} tok/s", flush=True)
        plain = time_engine(model, None, "none", prompts, args.max_new_tokens)
        print(f"[bench] {dtype} engine plain {plain['tok_s']:.2f} tok/s", flush=True)
        rows.append(("engine plain", dtype, plain))
        shapes = list(dict.fromkeys([args.chain, args.tree] + split_shapes(args.draft_shapes)))
        if args.speculative_dtypes is not None and dtype not in args.speculative_dtypes.split(","):
            shapes = []
        for shape in shapes:
            for vocab in vocabs:
                r = time_engine(model, drafter, shape, prompts, args.max_new_tokens, vocab, counts)
                r["break_even_tau"] = r["pass_ms"] / 1e3 * (base_tok_s or hf["tok_s"])
                r["tau_for_1.5x"] = 1.5 * r["break_even_tau"]
                name = f"engine {shape}" + (f" V={vocab}" if vocab else "")
                rows.append((name, dtype, r))
                print(f"[bench] {dtype} {name}: {r['tok_s']:.2f} tok/s, tau {r['tau']:.2f}, "
                      f"{r['pass_ms']:.0f} ms/pass, outside forwards {r['overhead']:.1%}", flush=True)
        ref = base_tok_s or hf["tok_s"]
        for name, dt, r in rows:
            r["speedup_vs_fp32_generate"] = r["tok_s"] / ref
            results["rows"].append({"method": name, "dtype": dt, **{k: v for k, v in r.items() if k != "new_tokens"}})
        same = all(r["new_tokens"] == plain["new_tokens"] for n, _, r in rows if n.startswith("engine"))
        results.setdefault("greedy_identical_to_plain", {})[dtype] = same
        if not args.skip_divergence and "cactus_divergence" not in results:
            results["cactus_divergence"] = cactus_tree_divergence(model, prompts)
    print_tables(results)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2))


def split_shapes(text: str) -> list[str]:
    """Split 'chain:2,tree:60,5,10' into shapes (tree shapes contain commas)."""
    out, parts = [], text.split(",")
    i = 0
    while i < len(parts):
        if parts[i].startswith("tree:"):
            out.append(",".join(parts[i:i + 3]))
            i += 3
        else:
            out.append(parts[i])
            i += 1
    return [s for s in out if s]


def print_tables(results: dict) -> None:
    print(f"\nprompts: {results['prompts']} ({results['source']}), max_new_tokens {results['max_new_tokens']}, "
          f"drafter: {results.get('drafter')}")
    print("| method | dtype | tok/s | speedup vs fp32 generate | tau | ms/pass | target ms | draft ms | "
          "outside forwards | break-even tau | tau for 1.5x |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results["rows"]:
        def f(k, fmt="{:.2f}", r=r):
            return fmt.format(r[k]) if k in r else ""
        print(f"| {r['method']} | {r['dtype']} | {f('tok_s', '{:.1f}')} | {f('speedup_vs_fp32_generate')} | "
              f"{f('tau')} | {f('pass_ms', '{:.1f}')} | {f('target_ms', '{:.1f}')} | {f('draft_ms', '{:.1f}')} | "
              f"{f('overhead', '{:.1%}')} | {f('break_even_tau')} | {f('tau_for_1.5x')} |")
    print(f"greedy outputs identical to engine plain: {results.get('greedy_identical_to_plain')}")
    print("\nCactus closed form: worst KL(h || q) / delta over q(n) in (0, 1) and where it exceeds delta")
    print("| delta | worst KL/delta | q(n) range with KL > delta |\n|---|---|---|")
    for delta, ratio, where in cactus_table():
        print(f"| {delta} | {ratio:.3f} | {where} |")
    if results.get("cactus_divergence"):
        print("\nCactus on trees (10 deterministic siblings = q's top 10; real target distributions):")
        print("| rule | delta | siblings judged by Cactus | mean KL/delta | max KL/delta | nodes |\n|---|---|---|---|---|---|")
        for name, delta, mode, mean, worst, n in results["cactus_divergence"]:
            print(f"| {name} | {delta} | {mode} | {mean:.3f} | {worst:.3f} | {n} |")


if __name__ == "__main__":
    main()
