"""Cactus: closed form vs exact KL solution, where the closed form exceeds delta, delta = 0 == SpS."""

from __future__ import annotations

import pytest
import torch

from eval.acceptance import (
    binary_kl,
    cactus_gamma_closed,
    cactus_gamma_exact,
    cactus_target,
    kl,
    make_rule,
    node_distribution,
)
from eval.warp import Warp

GRID_Q = torch.linspace(1e-6, 1 - 1e-6, 20001, dtype=torch.float64)


def test_binary_kl_equals_full_kl_of_h():
    """KL(h || q) over the whole vocabulary reduces to the binary KL of (h(n), q(n))."""
    g = torch.Generator().manual_seed(0)
    q = torch.rand(50, generator=g, dtype=torch.float64).softmax(0)
    for gamma in (q[3].item(), 0.2, 0.7, 0.999):
        h = cactus_target(q, 3, torch.tensor(gamma, dtype=torch.float64))
        assert float(h.sum()) == pytest.approx(1.0, abs=1e-12)
        assert kl(h, q) == pytest.approx(float(binary_kl(torch.tensor(gamma, dtype=torch.float64), q[3])), rel=1e-10, abs=1e-14)


@pytest.mark.parametrize("delta", [1e-4, 1e-3, 0.01, 0.05, 0.1, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0])
def test_exact_gamma_meets_the_kl_budget_on_a_dense_grid(delta):
    gamma = cactus_gamma_exact(GRID_Q, delta)
    assert torch.all(gamma >= GRID_Q) and torch.all(gamma <= 1)
    kls = binary_kl(gamma, GRID_Q)
    assert float((kls / delta).max()) <= 1 + 1e-6
    # and it is the maximum: either the budget is used up or gamma reached 1
    tight = (kls >= delta * (1 - 1e-6)) | (gamma == 1.0)
    assert bool(tight.all())


def test_exact_gamma_edge_cases():
    q = torch.tensor([0.0, 1.0, 0.5, 1e-300], dtype=torch.float64)
    assert cactus_gamma_exact(q, 0.0).tolist()[:3] == [0.0, 1.0, 0.5]
    out = cactus_gamma_exact(q, 1.0)
    assert out[0] == 0.0 and out[1] == 1.0 and torch.isfinite(out).all()
    assert float(cactus_gamma_exact(torch.tensor(0.5), 0.7)) == 1.0  # -ln 0.5 = 0.693 <= 0.7


@pytest.mark.parametrize("delta", [1e-5, 1e-4, 1e-3])
def test_exact_agrees_with_closed_form_to_second_order(delta):
    """The closed form is the second-order solution: the gap shrinks faster than sqrt(delta)."""
    q = torch.linspace(0.02, 0.98, 97, dtype=torch.float64)
    closed, exact = cactus_gamma_closed(q, delta), cactus_gamma_exact(q, delta)
    gap = (closed - exact).abs().max().item()
    step = (exact - q).abs().max().item()  # first order: ~ sqrt(2 delta q (1-q))
    assert gap <= 2.0 * delta  # O(delta), i.e. one order beyond the O(sqrt(delta)) step
    assert gap / step < 5 * delta ** 0.5


def _exceeding_ranges(delta: float) -> list[tuple[float, float]]:
    kls = binary_kl(cactus_gamma_closed(GRID_Q, delta), GRID_Q)
    over = (kls > delta * (1 + 1e-9)).tolist()
    out, start = [], None
    for i, flag in enumerate(over + [False]):
        if flag and start is None:
            start = i
        if not flag and start is not None:
            out.append((GRID_Q[start].item(), GRID_Q[i - 1].item()))
            start = None
    return out


@pytest.mark.parametrize(("delta", "lo", "hi", "worst"), [
    (0.01, 0.483, 0.99, 1.98),   # [0.483, 0.5] below one half, then up to 0.99 (2x)
    (0.1, 0.444, 0.905, 1.82),
    (0.5, 0.373, 0.607, 1.386),
    (1.0, 0.314, 0.367, 1.099),
])
def test_closed_form_exceeds_delta_exactly_where_documented(delta, lo, hi, worst):
    """DESIGN.md section 6: the paper's closed form is NOT conservative for every q(n) <= 0.5."""
    ranges = _exceeding_ranges(delta)
    assert len(ranges) == 1, ranges  # one contiguous interval (it straddles q = 0.5 for small delta)
    (a, b), = ranges
    assert a == pytest.approx(lo, abs=1.5e-3) and b == pytest.approx(hi, abs=1.5e-3)
    ratio = (binary_kl(cactus_gamma_closed(GRID_Q, delta), GRID_Q) / delta).max().item()
    assert ratio == pytest.approx(worst, abs=0.01)
    assert cactus_gamma_closed(torch.tensor(0.05), delta) <= cactus_gamma_exact(torch.tensor(0.05), delta)


def _q(seed: int, v: int = 30, scale: float = 2.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(v, generator=g, dtype=torch.float64) * scale).softmax(0)


@pytest.mark.parametrize("name", ["cactus", "cactus-exact"])
def test_first_sibling_rule_emits_exactly_h(name):
    """Default on trees: Cactus on the first sibling, lossless residual after: the emitted token ~ h."""
    rule = make_rule(name, Warp(1.0), delta=0.5)
    for seed in range(5):
        q = _q(seed)
        siblings = torch.argsort(q, descending=True)[[1, 0, 4, 7]].tolist()
        out = node_distribution(rule, q, siblings)
        h = cactus_target(q, siblings[0], rule.gamma(q[siblings[0]]))
        torch.testing.assert_close(out, h, rtol=0, atol=1e-12)
        if name == "cactus-exact":
            assert kl(out, q) <= 0.5 * (1 + 1e-6)


def test_all_siblings_variant_compounds_the_budget():
    """Applying Cactus at every sibling exceeds delta (why it is not the default)."""
    first = make_rule("cactus-exact", Warp(1.0), delta=0.3)
    every = make_rule("cactus-exact", Warp(1.0), delta=0.3, cactus_siblings="all")
    worst = 0.0
    for seed in range(20):
        q = _q(seed, scale=1.0)
        siblings = torch.argsort(q, descending=True)[:10].tolist()
        assert kl(node_distribution(first, q, siblings), q) <= 0.3 * (1 + 1e-6)
        worst = max(worst, kl(node_distribution(every, q, siblings), q) / 0.3)
    assert worst > 1.2


@pytest.mark.parametrize("name", ["cactus", "cactus-exact"])
def test_delta_zero_equals_sps_under_the_same_random_stream(name):
    from eval.proposer import DraftTree

    warp = Warp(0.9, top_p=0.95)
    sps, cac = make_rule("sps", warp), make_rule(name, warp, delta=0.0)
    g = torch.Generator().manual_seed(5)
    for trial in range(40):
        logits = torch.randn(8, 12, generator=g, dtype=torch.float64) * 2
        p = warp.probs(torch.randn(3, 12, generator=g, dtype=torch.float64))
        tree = DraftTree.chain(torch.multinomial(p, 1, generator=g).flatten(), draft_dists=p) if trial % 2 else \
            DraftTree(torch.tensor([1, 2, 3, 4, 5, 6, 7]), torch.tensor([-1, -1, -1, 0, 0, 1, 3]),
                      torch.tensor([1, 1, 1, 2, 2, 2, 3]), *(torch.ones(7, dtype=torch.float64),) * 3)
        rows = logits[: tree.num_nodes + 1]
        a = sps.walk(tree, rows, torch.Generator().manual_seed(trial))
        b = cac.walk(tree, rows, torch.Generator().manual_seed(trial))
        assert (a.path, a.next_token) == (b.path, b.next_token)


def test_cactus_accepts_more_than_sps():
    q = _q(1)
    siblings = [int(torch.argsort(q, descending=True)[2])]
    for name in ("cactus", "cactus-exact"):
        h = node_distribution(make_rule(name, Warp(1.0), delta=1.0), q, siblings)
        assert h[siblings[0]] > q[siblings[0]] + 0.1
