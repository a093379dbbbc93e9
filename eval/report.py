"""``results/NAME/report.md`` and PNG plots, written from the stored results alone.

``write_report(output_dir)`` reads ``results.jsonl`` (and ``grid.json``) and writes TAPS-style
tables (pooled tau with bootstrap CIs, speedup over plain decoding, verification budget,
quality and drift per rule), routing accuracy, entropy of accepted vs rejected draft tokens,
per-depth acceptance by drafter, and four plots.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from eval import report_stats as st
from eval.grid_store import GridStore, atomic_write_text

Record = dict


def _fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:{spec}}{suffix}"


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _temp_rule_groups(records: list[Record]) -> dict[tuple, list[Record]]:
    spec = [r for r in records if r["strategy"] != "plain"]
    return dict(sorted(st.group(spec, lambda r: (float(r["temperature"]), st.rule_label(r))).items()))


def _plain_for(plain: list[Record], temperature: float) -> list[Record]:
    return [r for r in plain if float(r["temperature"]) == temperature]


def tau_table(records: list[Record], plain: list[Record], benchmarks: list[str], row_key,
              with_budget: bool = False) -> str:
    """Rows by ``row_key``; columns: tau [CI] per benchmark, the average, speedup (and budget)."""
    rows = []
    for name, rs in sorted(st.group(records, row_key).items(), key=lambda kv: str(kv[0])):
        by_b = st.group(rs, lambda r: r["benchmark"])
        cells = [st.pooled_tau(by_b.get(b, [])).fmt() for b in benchmarks]
        taus = [st.pooled_tau(by_b[b]).tau for b in benchmarks if b in by_b]
        row = [str(name), *cells, _fmt(float(np.mean(taus)) if taus else None),
               _fmt(st.speedup(rs, plain), ".2f", "x")]
        if with_budget:
            nominal, actual = st.mean_budget(rs)
            row += [_fmt(nominal, ".0f"), _fmt(actual, ".1f")]
        rows.append(row)
    header = ["", *benchmarks, "average tau", "speedup"]
    if with_budget:
        header += ["nodes/pass (nominal)", "nodes/pass (actual)"]
    return _table(header, rows)


def rule_table(records: list[Record], plain: list[Record], benchmarks: list[str]) -> str:
    rows = []
    keyf = lambda r: (st.strategy_label(r), st.rule_label(r))  # noqa: E731
    for (strategy, rule), rs in sorted(st.group(records, keyf).items()):
        by_b = st.group(rs, lambda r: r["benchmark"])
        row = [strategy, rule]
        for b in benchmarks:
            sub = by_b.get(b, [])
            acc = st.accuracy(sub)
            row.append(f"{st.pooled_tau(sub).fmt()}; acc {_fmt(acc * 100 if acc is not None else None, '.0f', '%')}"
                       f"; drift {_fmt(st.drift(sub, plain), '+.3f')}")
        row.append(_fmt(st.speedup(rs, plain), ".2f", "x"))
        rows.append(row)
    return _table(["strategy", "rule", *benchmarks, "speedup"], rows)


def _plot_tau_by_benchmark(path: Path, groups: dict[str, dict[str, st.TauCI]], benchmarks: list[str],
                           title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(benchmarks) * max(1, len(groups)) / 3), 4))
    width = 0.8 / max(1, len(groups))
    x = np.arange(len(benchmarks))
    for i, (name, cis) in enumerate(groups.items()):
        taus = [cis[b].tau if b in cis else np.nan for b in benchmarks]
        err = [[max(0.0, cis[b].tau - cis[b].low) if b in cis else 0 for b in benchmarks],
               [max(0.0, cis[b].high - cis[b].tau) if b in cis else 0 for b in benchmarks]]
        ax.bar(x + i * width - 0.4 + width / 2, taus, width, yerr=err, label=name, capsize=2)
    ax.set_xticks(x, benchmarks)
    ax.set_ylabel("tau (pooled, 95% CI)")
    ax.set_title(title)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _plot_lines(path: Path, series: dict[str, tuple[list, list]], xlabel: str, ylabel: str, title: str,
                second: dict[str, tuple[list, list]] | None = None, ylabel2: str = "") -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ncols = 2 if second else 1
    fig, axes = plt.subplots(1, ncols, figsize=(6 * ncols, 4), squeeze=False)
    for ax, data, yl in zip(axes[0], [series, second or {}], [ylabel, ylabel2]):
        for name, (xs, ys) in data.items():
            ax.plot(xs, ys, marker="o", ms=3, label=name)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(yl)
        if data:
            ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_report(output_dir: str | Path) -> Path:
    """Write report.md and the plots into ``output_dir`` from its stored results."""
    store = GridStore(output_dir)
    root = store.root
    records = store.load_results()
    if not records:
        raise FileNotFoundError(f"{root / 'results.jsonl'} holds no results: run launch/eval_drafters.py first")
    meta = store.metadata()
    pair = (meta.get("spec") or {}).get("pair")
    benchmarks = [b for b in ("gsm8k", "mt_bench", "math_500", "svamp") if any(r["benchmark"] == b for r in records)]
    plain = [r for r in records if r["strategy"] == "plain"]
    out = [f"# Evaluation report: {root.name}\n",
           f"Settings: `{json.dumps(meta.get('settings', {}))}`; drafters: `{json.dumps(meta.get('drafter_dirs', {}))}`.\n",
           "tau = tokens emitted by verification passes / verification passes, pooled over prompts and turns "
           "(DESIGN.md section 8); brackets: 95% bootstrap CI over prompts. Speedup = plain-decoding wall time / "
           "speculative wall time on the same prompts, model and hardware (plain rows: tau = 1). "
           "`route-oracle` is an ORACLE: per question it takes the specialist that did better on that question "
           "in the full single runs (chosen after the fact, not a deployable strategy).\n"]
    collapsed = sorted({(r["rule"], tuple(r.get("covers") or [])) for r in records if r.get("covers")})
    for rule, covers in collapsed:
        out.append(f"At temperature 0 every acceptance rule reduces to greedy acceptance: the requested cells "
                   f"{', '.join(covers)} were run once, as `{rule}`.\n")
    plots: list[str] = []
    for (temp, rule), rs in _temp_rule_groups(records).items():
        pl = _plain_for(plain, temp)
        singles = [r for r in rs if r["strategy"] == "single"]
        out.append(f"\n## T = {temp:g}, rule {rule}\n")
        if singles:
            out.append("\n### tau per drafter x benchmark\n\n")
            out.append(tau_table(singles, pl, benchmarks, lambda r: r["drafter"]))
        out.append("\n### tau per strategy x benchmark (with verification budget)\n\n")
        out.append(tau_table(rs, pl, benchmarks, st.strategy_label, with_budget=True))
        if temp == 0 and pl:
            same = {k: st.identical_to_plain(g, pl) for k, g in sorted(st.group(rs, st.strategy_label).items())}
            out.append("\nGreedy exactness (outputs identical to plain decoding; expected all in float32): "
                       + ", ".join(f"{k} {a}/{n}" for k, (a, n) in same.items()) + ".\n")
        name = f"tau_by_benchmark_T{temp:g}_{rule.split()[0]}.png"
        groups = {k: {b: st.pooled_tau(v) for b, v in st.group(g, lambda r: r["benchmark"]).items()}
                  for k, g in sorted(st.group(rs, st.strategy_label).items())}
        _plot_tau_by_benchmark(root / name, groups, benchmarks, f"tau by benchmark and strategy, T={temp:g}, {rule}")
        plots.append(name)
    spec_records = [r for r in records if r["strategy"] != "plain"]
    for temp in sorted({float(r["temperature"]) for r in spec_records}):
        rs = [r for r in spec_records if float(r["temperature"]) == temp]
        out.append(f"\n## Rules and quality, T = {temp:g}\n\n"
                   "Each cell: tau [CI]; answer accuracy; drift = target mean log-likelihood of the generated "
                   "tokens minus that of plain decoding on the same prompts (0 = no drift; negative = less "
                   "target-like).\n\n")
        out.append(rule_table(rs, _plain_for(plain, temp), benchmarks))
    if plain:
        rows = [[b, _fmt(float(t), "g"), _fmt(st.accuracy(g) * 100 if st.accuracy(g) is not None else None,
                                              ".0f", "%"), _fmt(st.tokens_per_s(g), ".1f")]
                for (b, t), g in sorted(st.group(plain, lambda r: (r["benchmark"], r["temperature"])).items())]
        out.append("\n## Plain decoding baseline\n\n" + _table(["benchmark", "T", "accuracy", "tokens/s"], rows))
    routed = [r for r in spec_records if r["strategy"] in ("route-confidence", "route-entropy", "route-oracle")]
    if routed:
        rows = []
        for (_strategy, temp, rule), g in sorted(st.group(
                routed, lambda r: (r["strategy"], r["temperature"], st.rule_label(r))).items()):
            by_b = st.group(g, lambda r: r["benchmark"])
            rows.append([st.strategy_label(g[0]), f"{temp:g}", rule,
                         *[_fmt(None if st.routing_accuracy(by_b.get(b, []), pair) is None
                                else st.routing_accuracy(by_b[b], pair) * 100, ".1f", "%") for b in benchmarks]])
        out.append(f"\n## Routing accuracy (share of steps picking the prompt's specialist; math = {pair and pair[0]}, "
                   f"chat = {pair and pair[1]})\n\nConfidence vs entropy routing; the oracle row: share of decoding steps on which "
                   "the prompt's own specialist had the better single run of that question.\n\n")
        out.append(_table(["strategy", "T", "rule", *benchmarks], rows))
        series = {}
        live = [r for r in routed if r["strategy"] != "route-oracle"]
        for (strategy, b), g in sorted(st.group(live, lambda r: (r["strategy"], r["benchmark"])).items()):
            ys = st.routing_over_steps(g)
            series[f"{strategy} {b}"] = (list(range(1, len(ys) + 1)), ys)
        _plot_lines(root / "routing_over_steps.png", series, "decoding step",
                    f"share of prompts routed to {pair and pair[0]}", "routing choices over decoding steps")
        plots.append("routing_over_steps.png")
    singles = [r for r in spec_records if r["strategy"] == "single"]
    if singles:
        rows, series = [], {}
        for (drafter, temp), g in sorted(st.group(singles, lambda r: (r["drafter"], r["temperature"])).items()):
            e = st.entropy_split(g)
            rows.append([drafter, f"{temp:g}", _fmt(e["accepted"], ".3f"), _fmt(e["rejected"], ".3f"),
                         str(e["n_accepted"]), str(e["n_rejected"])])
        out.append("\n## Drafter entropy (nats) of accepted vs rejected draft tokens (single drafters)\n\n")
        out.append(_table(["drafter", "T", "accepted", "rejected", "n accepted", "n rejected"], rows))
        depth_rows = []
        for (drafter, b, temp), g in sorted(st.group(
                singles, lambda r: (r["drafter"], r["benchmark"], r["temperature"])).items()):
            alphas = st.depth_acceptance(g)
            depth_rows.append([drafter, b, f"{temp:g}", *[_fmt(a, ".2f") for a in alphas]])
        for (drafter, temp), g in sorted(st.group(singles, lambda r: (r["drafter"], r["temperature"])).items()):
            alphas = st.depth_acceptance(g)
            series[f"{drafter} T={temp:g}"] = (list(range(1, len(alphas) + 1)), alphas)
        width = max((len(r) for r in depth_rows), default=3) - 3
        out.append("\n## Per-depth acceptance alpha_d by drafter (passes accepting a depth-d token / passes that tried depth d)\n\n")
        out.append(_table(["drafter", "benchmark", "T", *[f"d={d + 1}" for d in range(width)]],
                          [r + ["-"] * (width + 3 - len(r)) for r in depth_rows]))
        _plot_lines(root / "acceptance_by_depth.png", series, "depth", "acceptance rate alpha_d",
                    "acceptance by depth per drafter")
        plots.append("acceptance_by_depth.png")
    delta_recs = [r for r in spec_records if r.get("delta") is not None]
    if delta_recs:
        tau_s, acc_s = {}, {}
        for (label, rule, temp), g in sorted(st.group(
                delta_recs, lambda r: (st.strategy_label(r), r["rule"], r["temperature"])).items()):
            by_d = sorted(st.group(g, lambda r: r["delta"]).items())
            xs = [d for d, _ in by_d]
            tau_s[f"{label} {rule} T={temp:g}"] = (xs, [st.pooled_tau(v).tau for _, v in by_d])
            acc_s[f"{label} {rule} T={temp:g}"] = (xs, [st.accuracy(v) if st.accuracy(v) is not None else np.nan
                                                      for _, v in by_d])
        _plot_lines(root / "tau_quality_vs_delta.png", tau_s, "delta", "tau", "tau and quality against delta",
                    second=acc_s, ylabel2="answer accuracy")
        plots.append("tau_quality_vs_delta.png")
    out.append("\n## Plots\n\n" + "".join(f"![{p}]({p})\n\n" for p in plots))
    path = root / "report.md"
    atomic_write_text(path, "".join(out))
    return path
