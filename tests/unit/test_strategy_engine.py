"""Combination strategies end to end through the engine, on a tiny float64 target and untrained drafters."""

from __future__ import annotations

import pytest
import torch

from checkpoints.averaging import average_drafters
from eval.acceptance import make_rule
from eval.drafting import DrafterSession
from eval.engine import SpeculativeEngine
from eval.proposer import DraftShape, SingleProposer
from eval.strategies import MergedProposer, RoutedProposer
from eval.warp import Warp
from tests.conftest import make_tiny_target
from training.drafter import DrafterConfig, EagleDrafter
from training.target import FrozenTarget

VOCAB = 24  # small vocabulary: random top-k trees then hit the target's choice often enough
SHAPE = DraftShape.parse("tree:16,3,4")
RULES = [("greedy", {}), ("sps", {}), ("tas", {}), ("cactus", {"delta": 0.5}), ("cactus-exact", {"delta": 0.5})]


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models are dominated by thread start-up: one thread is ~20x faster on a loaded 2-core CPU."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def models(one_thread):
    target = make_tiny_target(vocab_size=VOCAB, hidden_size=32, layers=2, seed=3, dtype=torch.float64)
    frozen = FrozenTarget(target, "tiny")
    drafters = []
    for seed in (11, 12):
        cfg = DrafterConfig.from_target(target.config, frozen.info(), seed=seed)
        drafters.append(EagleDrafter.from_config(cfg).to(torch.float64).eval())
    return target, frozen, drafters


def proposer(kind: str, models, shape: DraftShape = SHAPE):
    _, frozen, (a, b) = models
    if kind == "single":
        return SingleProposer(DrafterSession(a, frozen), shape)
    if kind == "average":
        return SingleProposer(DrafterSession(average_drafters([a, b], [0.5, 0.5]), frozen), shape)
    sessions = [DrafterSession(a, frozen), DrafterSession(b, frozen)]
    if kind.startswith("route-"):
        mode = kind.removeprefix("route-")
        return RoutedProposer(sessions, shape, mode, choice=1 if mode == "oracle" else None)
    return MergedProposer(sessions, shape, kind.removeprefix("merge-"))


def generate(models, prop, rule="sps", temperature=0.0, prompt_seed=0, n=12, gen_seed=0, **kw):
    target = models[0]
    warp = Warp(temperature=temperature)
    engine = SpeculativeEngine(target, prop, make_rule(rule, warp, **kw), max_new_tokens=n, warp=warp)
    prompt = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(prompt_seed))
    return prompt, engine.generate(prompt, torch.Generator().manual_seed(gen_seed))


def greedy_reference(target, prompt, n):
    ids = prompt
    with torch.no_grad():
        for _ in range(n):
            nxt = target(input_ids=ids).logits[0, -1].argmax()
            ids = torch.cat([ids, nxt.view(1, 1)], 1)
    return ids[0, prompt.shape[1]:].tolist()


STRATEGIES = ["single", "average", "route-confidence", "route-entropy", "route-oracle",
              "merge-concat", "merge-trie", "merge-equal-budget"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_strategy_runs_with_every_rule(models, strategy):
    for rule, kw in RULES:
        for temperature in ((0.0,) if rule == "greedy" else (0.0, 1.0)):
            prop = proposer(strategy, models)
            _, rec = generate(models, prop, rule, temperature, n=10, gen_seed=5, **kw)
            assert len(rec.new_tokens) == 10 and all(0 <= t < VOCAB for t in rec.new_tokens)
            assert rec.verify_tokens == 9 and rec.verify_passes >= 1
            if strategy.startswith(("route-", "merge-")):  # one routing/merge record per step
                assert len(rec.step_log) == rec.verify_passes
                assert all(("route" in s) == strategy.startswith("route-") for s in rec.step_log)


def test_chains_at_temperature_one_run_for_pair_strategies(models):
    shape = DraftShape.parse("chain:4")
    for strategy in STRATEGIES[2:]:
        _, rec = generate(models, proposer(strategy, models, shape), "sps", 1.0, n=10, gen_seed=2)
        assert len(rec.new_tokens) == 10 and rec.verify_passes >= 1
        assert max(rec.proposed_per_pass) <= (4 if strategy in ("merge-equal-budget",) or
                                              strategy.startswith("route-") else 8)


@pytest.mark.parametrize("strategy", ["merge-concat", "merge-trie", "merge-equal-budget",
                                      "route-confidence", "route-entropy"])
def test_temperature_zero_is_exactly_target_greedy(models, strategy):
    accepted = 0
    for prompt_seed in range(4):
        prompt, rec = generate(models, proposer(strategy, models), "sps", 0.0, prompt_seed=prompt_seed, n=16)
        assert rec.new_tokens == greedy_reference(models[0], prompt, 16)
        accepted += sum(rec.accepted_per_pass)
    assert accepted > 0  # drafts were accepted, so the tree walk was exercised


@pytest.mark.parametrize("mode", ["confidence", "entropy"])
def test_routing_verifies_exactly_one_tree_per_step(models, mode):
    for prompt_seed in range(3):
        _, rec = generate(models, proposer(f"route-{mode}", models), "sps", 1.0, prompt_seed=prompt_seed,
                          n=16, gen_seed=prompt_seed)
        assert len(rec.step_log) == rec.verify_passes == len(rec.proposed_per_pass)
        for step, nodes in zip(rec.step_log, rec.proposed_per_pass):
            assert nodes == step["nodes"][step["route"]] <= SHAPE.budget
            a, b = step["scores"]
            assert step["route"] == (0 if a >= b else 1)


def test_equal_budget_merged_tree_never_exceeds_a_single_tree(models):
    for prompt_seed in range(3):
        _, single = generate(models, proposer("single", models), "sps", 0.0, prompt_seed=prompt_seed, n=16)
        _, eq = generate(models, proposer("merge-equal-budget", models), "sps", 1.0,
                         prompt_seed=prompt_seed, n=16, gen_seed=1)
        _, concat = generate(models, proposer("merge-concat", models), "sps", 1.0, prompt_seed=prompt_seed, n=16)
        assert max(eq.proposed_per_pass) <= min(single.proposed_per_pass) == SHAPE.budget
        assert all(s["merged"] <= SHAPE.budget for s in eq.step_log)
        assert all(s["merged"] == sum(s["nodes"]) == 2 * SHAPE.budget for s in concat.step_log)


def test_routing_sampled_chains_depends_on_the_context_only(models):
    """At T > 0 the routing choice must not depend on the sampled tokens (else SpS is biased)."""
    _, frozen, (a, b) = models
    prompt = torch.randint(2, VOCAB, (1, 7), generator=torch.Generator().manual_seed(4))
    feats, logits = frozen(prompt)
    routes = set()
    for seed in range(4):
        prop = RoutedProposer([DrafterSession(a, frozen), DrafterSession(b, frozen)], DraftShape.parse("chain:3"))
        prop.start(prompt, feats, int(logits[0, -1].argmax()))
        tree = prop.propose(Warp(temperature=1.0), torch.Generator().manual_seed(seed))
        assert tree.draft_dists is not None and tree.num_nodes == 3
        routes.add((prop.step_log[-1]["route"], tuple(prop.step_log[-1]["scores"])))
    assert len(routes) == 1
