"""Recipe table, nested row selection (balanced within large), shared held-out sets, shortfall errors."""

from __future__ import annotations

import pytest

from data_recipes.recipes import (
    ShortfallError,
    fitting_scale,
    heldout_size,
    load_recipe_table,
    plan_draws,
    walk_draw,
)


@pytest.fixture(scope="module")
def table():
    return load_recipe_table()


def _select(table, mix, sizes, scale, seed=42, usable=None):
    draws = plan_draws(table, mix, sizes, scale=scale, seed=seed)
    return {d: walk_draw(draw, usable) for d, draw in draws.items()}


def test_declared_recipes(table):
    assert table.recipes == {"math": {"math": 70000}, "chat": {"chat": 70000},
                             "balanced": {"math": 35000, "chat": 35000}, "large": {"math": 70000, "chat": 70000}}
    assert table.seed == 42 and table.heldout_fraction == 0.02
    assert "gsm8k" in table.domains["math"] and table.domains["chat"] == ["sharegpt"]
    with pytest.raises(ValueError, match="unknown mixture"):
        table.recipe("huge")


def test_counts_at_scale(table):
    sel = _select(table, "balanced", {"math": 7473, "chat": 16540}, 0.1)
    for d in ("math", "chat"):
        assert sel[d].draw == 3500 and sel[d].heldout == 140 and sel[d].train == 3360
        assert len(sel[d].train_index) == 3360 and len(sel[d].heldout_index) == 140
    assert heldout_size(table, "math", 1.0) == 1400


@pytest.mark.parametrize("seed", [42, 7])
def test_balanced_and_math_are_subsets_of_large_and_heldout_is_shared(table, seed):
    sizes = {"math": 9000, "chat": 12000}
    large = _select(table, "large", sizes, 0.1, seed)
    balanced = _select(table, "balanced", sizes, 0.1, seed)
    math = _select(table, "math", sizes, 0.1, seed)
    for d in ("math", "chat"):
        assert balanced[d].train_index == large[d].train_index[: len(balanced[d].train_index)]
        assert balanced[d].heldout_index == large[d].heldout_index
        all_train = set(large[d].train_index) | set(balanced[d].train_index)
        assert not all_train & set(large[d].heldout_index)
        assert len(set(large[d].train_index)) == len(large[d].train_index)
    assert math["math"].train_index == large["math"].train_index
    assert math["math"].heldout_index == large["math"].heldout_index
    assert "chat" not in math


def test_selection_depends_on_seed(table):
    a = _select(table, "balanced", {"math": 9000, "chat": 9000}, 0.1, 1)
    b = _select(table, "balanced", {"math": 9000, "chat": 9000}, 0.1, 2)
    assert a["math"].train_index != b["math"].train_index


def test_unusable_rows_are_skipped_and_nesting_still_holds(table):
    sizes = {"math": 9000, "chat": 9000}

    def usable(idx):
        return [i % 5 != 0 for i in idx]

    large = _select(table, "large", sizes, 0.1, usable=usable)
    balanced = _select(table, "balanced", sizes, 0.1, usable=usable)
    for d in ("math", "chat"):
        assert all(i % 5 for i in large[d].train_index + large[d].heldout_index)
        assert len(large[d].train_index) == 6860 and len(large[d].heldout_index) == 140
        assert balanced[d].train_index == large[d].train_index[:3360]
        assert balanced[d].unusable and all(i % 5 == 0 for i in balanced[d].unusable)


def test_shortfall_names_source_shortfall_and_fitting_scale(table):
    with pytest.raises(ShortfallError) as err:
        plan_draws(table, "large", {"math": 7473, "chat": 16540}, scale=1.0, seed=42,
                   pool_sources={"math": ["gsm8k"], "chat": ["sharegpt"]})
    text = str(err.value)
    assert "gsm8k" in text and "shortfall 62,527" in text and "sharegpt" in text and "shortfall 53,460" in text
    assert "--scale 0.106" in text
    fit = fitting_scale({"math": 70000, "chat": 70000}, {"math": 7473, "chat": 16540})
    assert fit == 0.106
    _select(table, "large", {"math": 7473, "chat": 16540}, fit)  # the suggested scale fits


def test_shortfall_after_tokenisation(table):
    draws = plan_draws(table, "math", {"math": 100}, scale=0.001, seed=42)
    with pytest.raises(ShortfallError, match="usable after tokenisation"):
        walk_draw(draws["math"], lambda idx: [i % 2 == 0 for i in idx], sources="gsm8k")


def test_bad_scale(table):
    with pytest.raises(ValueError, match="scale"):
        plan_draws(table, "math", {"math": 100}, scale=0, seed=42)
