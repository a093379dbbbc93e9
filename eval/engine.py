"""The speculative decoding engine: prefill, propose, verify a whole tree in one target pass, walk.

One loop serves every case: a ``Proposer`` drafts a ``DraftTree`` (empty for plain decoding), the
target verifies root + tree in one forward (tree attention mask, position ids = prefix + depth),
the acceptance rule walks the tree, and both KV caches keep exactly the accepted path.
Batch size 1; any device (CUDA when present); sampling randomness comes from one CPU generator.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence

import torch

from eval.acceptance import AcceptanceRule, make_rule
from eval.kv_cache import cache_length, keep_tail, new_cache, prefix_tree_mask
from eval.metrics import GenerationRecord
from eval.proposer import DraftShape, DraftTree, NoProposer, Proposer, SingleProposer
from eval.warp import Warp

_EAGER_LOGIT_ROWS = 8  # verify passes with at most this many rows project all rows at once


class _RowLogits:
    """Target logits of the verified rows, projected through ``lm_head`` only when the walk asks."""

    def __init__(self, lm_head, hidden: torch.Tensor):
        self.lm_head, self.hidden = lm_head, hidden
        self.rows: dict[int, torch.Tensor] = {}
        self.all = lm_head(hidden) if hidden.shape[0] <= _EAGER_LOGIT_ROWS else None

    def __getitem__(self, i: int) -> torch.Tensor:
        if self.all is not None:
            return self.all[i]
        if i not in self.rows:
            self.rows[i] = self.lm_head(self.hidden[i])
        return self.rows[i]


class TargetRunner:
    """The target causal LM with a KV cache of the committed sequence (the root excluded)."""

    def __init__(self, model):
        self.model = model.eval()
        self.base = model.get_decoder() if hasattr(model, "get_decoder") else model.model
        self.lm_head = model.get_output_embeddings()
        self.cache = None
        param = next(self.model.parameters())
        self.device, self.dtype = param.device, param.dtype

    @torch.no_grad()
    def forward(self, ids: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
        """Hidden states (n, h) of ``ids`` appended after the cache (mask: (n, n) among new tokens)."""
        # a single new token attends to everything: no mask (the fast path generate() takes too)
        mask = None if tree_mask.shape[0] == 1 else prefix_tree_mask(cache_length(self.cache),
                                                                   tree_mask.to(self.device), self.dtype)
        out = self.base(input_ids=ids.reshape(1, -1).to(self.device), attention_mask=mask,
                        position_ids=positions.reshape(1, -1).to(self.device), cache=self.cache, use_cache=True)
        return out.last_hidden_state[0]

    @torch.no_grad()
    def prefill(self, prompt_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Features (L, h) of the prompt and the logits (V,) at its last position."""
        self.cache = new_cache(self.model.config)
        n = prompt_ids.shape[-1]
        hidden = self.forward(prompt_ids, torch.arange(n), torch.ones(n, n, dtype=torch.bool).tril())
        return hidden, self.lm_head(hidden[-1])

    @torch.no_grad()
    def verify(self, root: int, tree: DraftTree) -> tuple[torch.Tensor, _RowLogits]:
        """One forward over [root] + tree nodes; returns their features and lazily projected logits."""
        prefix, n = cache_length(self.cache), tree.num_nodes
        ids = torch.cat([torch.tensor([root], device=self.device), tree.tokens.to(self.device)])
        positions = prefix + torch.cat([torch.zeros(1, dtype=torch.long), tree.depths.cpu()])
        mask = torch.zeros(n + 1, n + 1, dtype=torch.bool)
        mask[:, 0] = True
        mask[1:, 1:] = tree.attention_mask().cpu()
        hidden = self.forward(ids, positions, mask)
        return hidden, _RowLogits(self.lm_head, hidden)

    def commit(self, prefix: int, path: Sequence[int]) -> None:
        """Keep the prefix, the root and the accepted nodes' entries (node i sits at prefix + 1 + i)."""
        keep = torch.tensor([prefix + 1 + i for i in path], dtype=torch.long)
        keep_tail(self.cache, prefix + 1, keep)


class SpeculativeEngine:
    """``generate(prompt_ids, generator) -> GenerationRecord`` for one prompt (batch size 1)."""

    def __init__(self, target_model, proposer: Proposer | None, rule: AcceptanceRule, *,
                 max_new_tokens: int = 256, eos_token_ids: Iterable[int] | int | None = None,
                 warp: Warp | None = None):
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        self.target = TargetRunner(target_model)
        self.proposer = proposer if proposer is not None else NoProposer()
        self.rule = rule
        self.warp = warp if warp is not None else rule.warp
        self.max_new_tokens = int(max_new_tokens)
        if isinstance(eos_token_ids, int):
            eos_token_ids = [eos_token_ids]
        self.eos = {int(e) for e in (eos_token_ids or [])}

    def _sync(self) -> None:
        if self.target.device.type == "cuda":
            torch.cuda.synchronize(self.target.device)

    @torch.no_grad()
    def generate(self, prompt_ids: torch.Tensor, generator: torch.Generator | None = None) -> GenerationRecord:
        if prompt_ids.dim() == 1:
            prompt_ids = prompt_ids[None]
        if prompt_ids.shape[0] != 1 or prompt_ids.shape[1] < 1:
            raise ValueError(f"prompt_ids must have shape (1, L) with L >= 1, got {tuple(prompt_ids.shape)}")
        generator = generator if generator is not None else torch.Generator().manual_seed(0)
        vocab = self.target.lm_head.weight.shape[0]
        rec = GenerationRecord(prompt_tokens=int(prompt_ids.shape[1]))
        self._sync()
        t0 = time.perf_counter()
        features, logits = self.target.prefill(prompt_ids)
        root = _sample_first(self.rule, logits, generator)
        rec.new_tokens.append(root)
        self.proposer.start(prompt_ids.to(self.target.device), features[None], root)
        self._sync()
        rec.prefill_s = time.perf_counter() - t0
        while True:
            if root in self.eos:
                rec.stop_reason = "eos"
                break
            if len(rec.new_tokens) >= self.max_new_tokens:
                rec.stop_reason = "max_new_tokens"
                break
            t1 = time.perf_counter()
            tree = self.proposer.propose(self.warp, generator)
            if tree.num_nodes and (int(tree.tokens.min()) < 0 or int(tree.tokens.max()) >= vocab):
                raise ValueError(f"proposer drafted tokens outside the target vocabulary [0, {vocab})")
            self._sync()
            t2 = time.perf_counter()
            prefix = cache_length(self.target.cache)
            hidden, row_logits = self.target.verify(root, tree)
            walk = self.rule.walk(tree, row_logits, generator)
            self._sync()
            t3 = time.perf_counter()
            emitted = tree.tokens[walk.path].tolist() + [walk.next_token]
            kept = _truncate(emitted, self.eos, self.max_new_tokens - len(rec.new_tokens))
            rec.new_tokens.extend(kept)
            depths = tree.depths.tolist()
            rec.add_pass(depths, set(walk.accepted_nodes), len(walk.path),
                         {depths[i] for i in walk.tried_nodes}, tree.entropy.tolist(), tree.origin.tolist(),
                         len(kept))
            rec.step_log.extend(self.proposer.step_log)
            self.proposer.step_log.clear()
            finished = len(kept) < len(emitted) or kept[-1] in self.eos \
                or len(rec.new_tokens) >= self.max_new_tokens
            t4 = time.perf_counter()
            # the target cache always ends as prompt + new tokens except the last (the next root)
            self.target.commit(prefix, walk.path[: len(kept) - 1])
            if not finished:
                rows = torch.tensor([0] + [i + 1 for i in walk.path], device=hidden.device)
                self.proposer.advance(tree.tokens[walk.path], hidden[rows], walk.next_token)
                root = walk.next_token
            self._sync()
            t5 = time.perf_counter()
            rec.target_s += t3 - t2
            rec.draft_s += (t2 - t1) + (t5 - t4)
            if finished:
                rec.stop_reason = "eos" if kept[-1] in self.eos else "max_new_tokens"
                break
        rec.wall_s = time.perf_counter() - t0
        return rec


def _sample_first(rule: AcceptanceRule, logits: torch.Tensor, generator: torch.Generator) -> int:
    """The prefill token: argmax for greedy, else a sample from the warped q (not counted in tau)."""
    from eval.acceptance import _sample

    return _sample(rule.target_probs(logits), generator)


def _truncate(tokens: list[int], eos: set[int], room: int) -> list[int]:
    """Cut after the first EOS and to at most ``room`` tokens."""
    out = []
    for t in tokens[:room]:
        out.append(t)
        if t in eos:
            break
    return out


def default_draft_shape(device: torch.device | str) -> DraftShape:
    """The draft shape to use when none is given, chosen from measured costs (docs/engine.md):
    on CPU a verification pass grows steeply with its width (fp32: 45 / 72 / 157 ms for 1 / 4 / 60
    tokens) and every EAGLE-2 round costs a 10-row lm_head, so a chain of 4 needs tau ~2.2 to break
    even while the 60-node tree needs ~5; on GPUs the width is nearly free: the TAPS tree 60/5/10."""
    return DraftShape.parse("tree:60,5,10" if torch.device(device).type == "cuda" else "chain:4")


def build_engine(target_model, *, drafter=None, shape: str | DraftShape = "auto", rule: str = "sps",
                 temperature: float = 0.0, top_k: int = 0, top_p: float = 1.0, delta: float = 1.0,
                 max_new_tokens: int = 256, eos_token_ids=None, standalone_lm=None,
                 draft_vocab: int | None = None, token_counts=None) -> SpeculativeEngine:
    """One call for entry points: ``drafter`` is an ``EagleDrafter``, a drafter directory, or None
    (plain decoding, unless ``standalone_lm``, a small causal LM, drafts chains of ``shape.k``).
    ``shape="auto"`` picks ``default_draft_shape`` for the target's device. ``draft_vocab`` N restricts
    proposals to the N most-trained tokens (``token_counts``, read from a drafter directory by default)."""
    from eval.drafting import DrafterSession
    from eval.proposer import StandaloneLMProposer
    from training.target import FrozenTarget

    if shape == "auto":
        shape = default_draft_shape(next(target_model.parameters()).device)
    shape = DraftShape.parse(shape) if isinstance(shape, str) else shape
    warp = Warp(temperature, top_k, top_p)
    frozen = FrozenTarget(target_model)
    if isinstance(drafter, (str, bytes)) or hasattr(drafter, "__fspath__"):
        from checkpoints.drafter_io import load_drafter
        from checkpoints.token_counts import load_token_counts

        if draft_vocab and token_counts is None:
            token_counts = load_token_counts(drafter)
        drafter = load_drafter(drafter, target=frozen.info(), device=frozen.lm_head.weight.device,
                               dtype=frozen.lm_head.weight.dtype)
    if standalone_lm is not None:
        if shape.kind != "chain":
            raise ValueError("a standalone draft LM drafts chains only: use --draft-shape chain:K")
        proposer = StandaloneLMProposer(standalone_lm, shape.k)
    elif drafter is None or shape.kind == "none":
        proposer = NoProposer()
    else:
        from eval.draft_vocab import draft_head

        eos = eos_token_ids if eos_token_ids is not None else getattr(target_model.config, "eos_token_id", None)
        head = draft_head(frozen.lm_head, token_counts, draft_vocab, [eos] if isinstance(eos, int) else list(eos or []))
        proposer = SingleProposer(DrafterSession(drafter, frozen, head), shape)
    return SpeculativeEngine(target_model, proposer, make_rule(rule, warp, delta=delta),
                             max_new_tokens=max_new_tokens, eos_token_ids=eos_token_ids, warp=warp)


def generate_turns(engine: SpeculativeEngine, tokenizer, turns: Sequence[str], generator: torch.Generator,
                   fresh_proposer=None) -> list[tuple[str, GenerationRecord]]:
    """Multi-turn chat: each turn is rendered with the chat template including the earlier answers
    (the target re-prefills the whole conversation). ``fresh_proposer()`` may supply a new proposer."""
    messages, out = [], []
    for text in turns:
        messages.append({"role": "user", "content": text})
        rendered = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        ids = torch.tensor([tokenizer(rendered, add_special_tokens=False)["input_ids"]],
                           device=engine.target.device)
        if fresh_proposer is not None:
            engine.proposer = fresh_proposer()
        rec = engine.generate(ids, generator)
        answer = tokenizer.decode(rec.new_tokens, skip_special_tokens=True)
        messages.append({"role": "assistant", "content": answer})
        out.append((answer, rec))
    return out
