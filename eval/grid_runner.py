"""Running the evaluation grid: models, proposers per cell, multi-turn generation, ranks, resume.

``run_grid(spec)`` expands the grid (``eval.grid``), skips finished cells (``eval.grid_store``),
shards each cell's prompts across ranks (torchrun / deepspeed set ``RANK`` and ``WORLD_SIZE``; gloo
on CPU), appends every finished prompt to the rank's part file, and lets rank 0 merge the cell,
write its completion marker and rebuild ``results.jsonl``. Each generation's random stream is
seeded from (cell, question id, turn), so results do not depend on the number of ranks.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch

from eval.grid import Cell, GridSpec, expand_cells, generation_seed, shard
from eval.grid_store import GridStore
from eval.quality import answer_correct, target_mean_logprob

log = logging.getLogger(__name__)
ENTROPY_BINS = 24  # histogram of draft-token entropies, bins of 0.5 nats (last bin open)


@dataclass
class Dist:
    rank: int = 0
    world_size: int = 1

    def barrier(self) -> None:
        if self.world_size > 1:
            torch.distributed.barrier()


def init_distributed() -> Dist:
    """Join the process group that torchrun / deepspeed describe in the environment (if any)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as td

    if not td.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        td.init_process_group(backend=backend, timeout=timedelta(hours=12))
    return Dist(td.get_rank(), td.get_world_size())


def finish_distributed() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


@dataclass
class Resources:
    """The target, its tokenizer and the loaded drafters (shared by every cell of a run)."""

    model: Any
    tokenizer: Any
    drafters: dict[str, Any]
    frozen: Any = None
    averages: dict[str, Any] = field(default_factory=dict)
    eos: list[int] = field(default_factory=list)
    counts: dict[str, Any] = field(default_factory=dict)  # drafter name -> token counts (or None)
    draft_vocab: int | None = None
    heads: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        from training.target import FrozenTarget

        if self.frozen is None:
            self.frozen = FrozenTarget(self.model)
        self.eos = self.eos or eos_ids(self.tokenizer, self.model)

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @classmethod
    def load(cls, spec: GridSpec) -> Resources:
        from checkpoints.drafter_io import load_drafter
        from training.target import FrozenTarget, load_target

        model, tokenizer = load_target(spec.target, dtype=spec.dtype)
        frozen = FrozenTarget(model, spec.target or "")
        info = frozen.info()
        dev, dtype = next(model.parameters()).device, next(model.parameters()).dtype
        drafters = {name: load_drafter(path, target=info, device=dev, dtype=dtype)
                    for name, path in spec.drafters.items()}
        counts = {}
        if spec.draft_vocab:
            from checkpoints.token_counts import load_token_counts

            counts = {name: load_token_counts(path) for name, path in spec.drafters.items()}
        return cls(model, tokenizer, drafters, frozen, counts=counts, draft_vocab=spec.draft_vocab)

    def head(self, *names: str):
        """The draft head of a drafter (or of the average of several): the full lm_head, or with
        ``draft_vocab`` the most frequent tokens of the (frequency-averaged) training counts."""
        from eval.draft_vocab import draft_head

        key = ",".join(names)
        if key not in self.heads:
            counts = None
            if self.draft_vocab:
                parts = [self.counts.get(n) for n in names]
                if all(c is not None for c in parts):  # each drafter's frequencies weigh the same
                    counts = sum(c.double() / max(1, int(c.sum())) for c in parts)
            self.heads[key] = draft_head(self.frozen.lm_head, counts, self.draft_vocab, self.eos, name=key)
        return self.heads[key]

    def averaged(self, a: str, b: str, alpha: float):
        key = f"{a},{b},{alpha}"
        if key not in self.averages:
            from checkpoints.averaging import average_drafters

            p = next(self.drafters[a].parameters())
            avg = average_drafters([self.drafters[a], self.drafters[b]], [alpha, 1.0 - alpha])
            self.averages[key] = avg.to(device=p.device, dtype=p.dtype).eval()
        return self.averages[key]


def build_proposer(cell: Cell, spec: GridSpec, res: Resources, shape, oracle_choice: int | None = None):
    """The proposer of one cell (a fresh object per generation)."""
    from eval.drafting import DrafterSession
    from eval.proposer import NoProposer, SingleProposer
    from eval.strategies import MergedProposer, RoutedProposer

    if cell.strategy == "plain":
        return NoProposer()
    if cell.strategy == "single":
        return SingleProposer(DrafterSession(res.drafters[cell.drafter], res.frozen, res.head(cell.drafter)), shape)
    a, b = spec.pair
    if cell.strategy == "average":
        return SingleProposer(DrafterSession(res.averaged(a, b, spec.average_alpha), res.frozen, res.head(a, b)),
                              shape)
    sessions = [DrafterSession(res.drafters[a], res.frozen, res.head(a)),
                DrafterSession(res.drafters[b], res.frozen, res.head(b))]
    if cell.strategy.startswith("route-"):
        mode = cell.strategy.removeprefix("route-")
        return RoutedProposer(sessions, shape, mode, choice=oracle_choice)
    return MergedProposer(sessions, shape, cell.strategy.removeprefix("merge-"))


def render_prompt(tokenizer, messages: list[dict]) -> list[int]:
    """The conversation so far, through the target's chat template, ready for the assistant turn."""
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def eos_ids(tokenizer, model) -> list[int]:
    ids = {tokenizer.eos_token_id}
    gen = getattr(model, "generation_config", None)
    eos = getattr(gen, "eos_token_id", None)
    ids |= set(eos if isinstance(eos, list) else [eos])
    vocab = tokenizer.get_vocab()
    ids |= {vocab.get(tok) for tok in ("<|im_end|>", "<|eot_id|>", "<|endoftext|>")}
    return sorted(i for i in ids if i is not None)


def _entropy_summary(values: list[float]) -> dict[str, Any]:
    hist = [0] * ENTROPY_BINS
    for v in values:
        hist[min(int(v / 0.5), ENTROPY_BINS - 1)] += 1
    return {"sum": float(sum(values)), "count": len(values), "hist": hist}


def pass_origins(gen) -> list[int | None]:
    """Per verification pass: the origin of the deepest accepted draft node (None: none accepted)."""
    out, start = [], 0
    for n in gen.proposed_per_pass:
        best: tuple[int, int | None] = (0, None)
        for i in range(start, start + n):
            if gen.draft_accepted[i] and gen.draft_depth[i] > best[0]:
                best = (gen.draft_depth[i], gen.draft_origin[i])
        out.append(best[1])
        start += n
    return out


def generation_fields(gen, merged: bool = False) -> dict[str, Any]:
    """The results.jsonl fields computed from one engine ``GenerationRecord`` (eval/metrics.py).

    ``routing``: per pass, the routed drafter (route-*) or, for merged trees, the origin of the
    deepest accepted node."""
    acc = [e for e, a in zip(gen.draft_entropy, gen.draft_accepted) if a]
    rej = [e for e, a in zip(gen.draft_entropy, gen.draft_accepted) if not a]
    origins: dict[str, list[int]] = {}
    for o, a in zip(gen.draft_origin, gen.draft_accepted):
        pair = origins.setdefault(str(o), [0, 0])
        pair[0] += int(a)
        pair[1] += 1
    routes = pass_origins(gen) if merged else [s.get("route") for s in gen.step_log if "route" in s]
    tau = gen.tau
    return {
        "new_token_ids": list(gen.new_tokens), "new_tokens": len(gen.new_tokens),
        "verify_tokens": gen.verify_tokens, "verify_passes": gen.verify_passes,
        "tau": None if tau != tau else tau, "wall_s": gen.wall_s, "prefill_s": gen.prefill_s,
        "target_s": gen.target_s, "draft_s": gen.draft_s, "stop_reason": gen.stop_reason,
        "accepted_per_pass": list(gen.accepted_per_pass), "tree_nodes": int(sum(gen.proposed_per_pass)),
        "depth_proposed": list(gen.depth_proposed), "depth_reached": list(gen.depth_reached),
        "depth_accepted": list(gen.depth_accepted),
        "entropy_accepted": _entropy_summary(acc), "entropy_rejected": _entropy_summary(rej),
        "origin_accepted": origins, "routing": routes if routes else None,
    }


def run_question(question, cell: Cell, spec: GridSpec, res: Resources, shape, *,
                 oracle_choice: int | None = None, drift: bool = True) -> list[dict]:
    """Decode every turn of one question (later turns see the earlier generated answers)."""
    from eval.acceptance import make_rule
    from eval.engine import SpeculativeEngine
    from eval.warp import Warp

    warp = Warp(temperature=cell.temperature, top_k=spec.top_k, top_p=spec.top_p)
    rule_name = "greedy" if cell.rule in ("greedy", "plain") and cell.temperature == 0 else cell.rule
    rule = make_rule("sps" if rule_name == "plain" else rule_name, warp,
                     **({"delta": cell.delta} if cell.delta is not None else {}))
    messages: list[dict] = []
    records = []
    for turn, text in enumerate(question.turns):
        messages.append({"role": "user", "content": text})
        prompt = torch.tensor([render_prompt(res.tokenizer, messages)], device=res.device)
        proposer = build_proposer(cell, spec, res, shape, oracle_choice)
        engine = SpeculativeEngine(res.model, proposer, rule, max_new_tokens=spec.max_new_tokens,
                                   eos_token_ids=res.eos, warp=warp)
        seed = generation_seed(cell, question.question_id, turn, spec.seed)
        generator = torch.Generator(device="cpu").manual_seed(seed)
        gen = engine.generate(prompt, generator)
        fields = generation_fields(gen, merged=cell.strategy.startswith("merge-"))
        new_ids = fields.pop("new_token_ids")
        output = res.tokenizer.decode(new_ids, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": output})
        ref = question.references[turn] if turn < len(getattr(question, "references", []) or []) else (
            question.reference if turn == 0 else None)
        records.append({
            **cell.describe(), "benchmark": question.benchmark, "question_id": question.question_id,
            "turn": turn, "domain": question.domain, "category": question.category,
            "top_p": spec.top_p, "top_k": spec.top_k, "draft_shape": str(shape), "seed": seed,
            "prompt_tokens": int(prompt.shape[1]), **fields,
            "verify_budget": getattr(proposer, "verify_budget", 0),
            "output_text": output,
            "correct": answer_correct(question.benchmark, output, ref) if ref is not None else None,
            "target_logprob": target_mean_logprob(res.model, prompt[0], new_ids) if drift else None,
            "oracle": False,
        })
    return records


def derive_oracle(cell: Cell, spec: GridSpec, store: GridStore, question_ids: list) -> list[dict]:
    """route-oracle records: per question, the specialist whose single run had the higher tau."""
    a, b = spec.pair
    runs = []
    for name in (a, b):
        single = Cell("single", name, cell.benchmark, cell.rule, cell.delta, cell.temperature, cell.covers)
        if not store.is_done(single):
            raise RuntimeError(f"route-oracle needs the finished single run {single.cell_id}")
        by_q: dict[str, list[dict]] = {}
        for r in store.cell_records(single):
            by_q.setdefault(str(r["question_id"]), []).append(r)
        runs.append(by_q)
    out = []
    for q in question_ids:
        taus = [sum(r["verify_tokens"] for r in run[str(q)]) / max(1, sum(r["verify_passes"] for r in run[str(q)]))
                for run in runs]
        pick = 0 if taus[0] >= taus[1] else 1
        for r in runs[pick][str(q)]:
            out.append({**r, **cell.describe(), "oracle": True, "oracle_choice": (a, b)[pick],
                        "routing": [pick] * int(r["verify_passes"])})
    return out


def _summary(records: list[dict]) -> dict[str, Any]:
    vt = sum(r["verify_tokens"] for r in records)
    vp = sum(r["verify_passes"] for r in records)
    wall = sum(r["wall_s"] for r in records)
    new = sum(r["new_tokens"] for r in records)
    return {"records": len(records), "prompts": len({str(r["question_id"]) for r in records}),
            "tau": vt / vp if vp else None, "new_tokens": new, "wall_s": wall,
            "tokens_per_s": new / wall if wall > 0 else None}


def load_questions(spec: GridSpec) -> dict[str, list]:
    from data_recipes.benchmarks import load_benchmark

    return {b: load_benchmark(b, data_dir=spec.data_dir, limit=spec.limit) for b in spec.benchmarks}


def default_shape(spec: GridSpec):
    """``--draft-shape`` or the measured default of this device (eval.engine.default_draft_shape)."""
    from eval.engine import default_draft_shape
    from eval.proposer import DraftShape

    if spec.draft_shape:
        return DraftShape.parse(spec.draft_shape)
    return default_draft_shape("cuda" if torch.cuda.is_available() else "cpu")


def work_items(cells: list[Cell], questions: dict[str, list], store: GridStore) -> list[tuple[Cell, Any]]:
    """Every unfinished (cell, question) of the generated cells, cell by cell in grid order."""
    items = []
    for cell in cells:
        if cell.derived:
            continue
        finished = store.done_questions(cell)
        items += [(cell, q) for q in questions[cell.benchmark] if str(q.question_id) not in finished]
    return items


def _complete(cell: Cell, store: GridStore, questions: dict[str, list]) -> None:
    """Merge a cell whose every prompt is stored, write its marker (rank 0 only)."""
    ids = [q.question_id for q in questions[cell.benchmark]]
    records = store.merge_parts(cell, ids)
    store.write_cell(cell, records, _summary(records))


def run_grid(spec: GridSpec, *, resources: Resources | None = None, questions: dict[str, list] | None = None,
             progress: bool = True, drift: bool = True) -> GridStore:
    """Run (or resume) every unfinished cell of the grid; returns the store of ``spec.output_dir``.

    The unfinished (cell, question) pairs are dealt round-robin over the ranks in grid order, so the
    ranks stay busy across cell boundaries (no barrier per cell). Rank 0 completes a cell as soon as
    every rank has stored its prompts; the rest are completed after the final barrier."""
    from tqdm.auto import tqdm

    dist = init_distributed()
    store = GridStore(spec.output_dir)
    if dist.rank == 0:
        store.check_settings(spec.to_dict(), spec.settings(), spec.drafters)
    cells = expand_cells(spec)
    questions = questions if questions is not None else load_questions(spec)
    shape = default_shape(spec)
    todo = [c for c in cells if not store.is_done(c)]
    items = work_items(todo, questions, store)
    dist.barrier()  # every rank has decided what is left before any prompt is stored
    if len(todo) < len(cells) and dist.rank == 0:
        log.info("resuming: %d of %d cells already finished", len(cells) - len(todo), len(cells))
    mine = shard(items, dist.rank, dist.world_size)
    if resources is None and mine:
        resources = Resources.load(spec)
    bar = tqdm(total=len(mine), desc="prompts", unit="prompt", disable=not progress or dist.rank != 0)
    vt = vp = 0
    pending = [c for c in todo if not c.derived]  # rank 0: cells not yet completed
    done_cells = len(cells) - len(todo)
    writers: dict[str, Any] = {}
    last_item = {cell.cell_id: k for k, (cell, _) in enumerate(mine)}  # this rank's last prompt of each cell
    for k, (cell, q) in enumerate(mine):
        if cell.cell_id not in writers:
            writers[cell.cell_id] = store.open_part(cell, dist.rank)
        recs = run_question(q, cell, spec, resources, shape, drift=drift)
        writers[cell.cell_id].append(q.question_id, recs)
        vt += sum(r["verify_tokens"] for r in recs if r["strategy"] != "plain")
        vp += sum(r["verify_passes"] for r in recs if r["strategy"] != "plain")
        if dist.rank == 0:  # complete the cells this rank has no more prompts of, once the others caught up
            for c in [c for c in pending if last_item.get(c.cell_id, -1) <= k]:
                ids = {str(x.question_id) for x in questions[c.benchmark]}
                if not ids <= store.done_questions(c):
                    break
                _complete(c, store, questions)
                pending.remove(c)
                done_cells += 1
                store.rebuild_results([c.cell_id for c in cells])
        bar.update(1)
        bar.set_postfix(cells=f"{done_cells}/{len(cells)}", tau=f"{vt / vp:.2f}" if vp else "-")
    dist.barrier()
    if dist.rank == 0:
        for cell in pending:
            _complete(cell, store, questions)
        for cell in todo:
            if cell.derived:
                records = derive_oracle(cell, spec, store, [q.question_id for q in questions[cell.benchmark]])
                store.write_cell(cell, records, _summary(records))
        store.rebuild_results([c.cell_id for c in cells])
    bar.close()
    dist.barrier()
    return store


def print_summary(store: GridStore, spec: GridSpec) -> None:
    """One line per finished cell of this grid: prompts, pooled tau, tokens/s."""
    wanted = {c.cell_id for c in expand_cells(spec)}
    rows = [c for c in store.done_cells() if c["cell_id"] in wanted]
    print(f"{'cell':<72} {'prompts':>7} {'tau':>6} {'tok/s':>7}")
    for c in rows:
        tau = "-" if c.get("tau") is None else f"{c['tau']:.3f}"
        tps = "-" if c.get("tokens_per_s") is None else f"{c['tokens_per_s']:.1f}"
        print(f"{c['cell_id']:<72} {c.get('prompts', 0):>7} {tau:>6} {tps:>7}")
    print(f"results: {store.root / 'results.jsonl'}")
