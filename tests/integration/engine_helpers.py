"""Test-only proposers for the engine tests (real target forwards, scripted or oracle drafts)."""

from __future__ import annotations

import pytest
import torch

from eval.proposer import DraftTree


class _Tracking:
    """Tracks the committed sequence through the Proposer callbacks."""

    verify_budget = 0

    def __init__(self):
        self.step_log: list[dict] = []
        self.seq: list[int] = []

    def start(self, prompt_ids, target_features, first_token):
        self.seq = prompt_ids.reshape(-1).tolist() + [int(first_token)]

    def advance(self, accepted_tokens, accepted_features, emitted_token):
        assert accepted_features.shape[0] == accepted_tokens.numel() + 1
        self.seq += accepted_tokens.reshape(-1).tolist() + [int(emitted_token)]


class OracleProposer(_Tracking):
    """Drafts the target's greedy continuation (looked up in ``reference``, the target's own greedy
    output after ``prompt_len`` tokens), corrupting some tokens; ``tree=True`` adds a distractor
    sibling (with its own child) at every depth, in random order."""

    def __init__(self, reference: list[int], prompt_len: int, vocab: int, k: int, corrupt: float, seed: int,
                 tree: bool = False):
        super().__init__()
        self.reference, self.prompt_len, self.vocab = reference, prompt_len, vocab
        self.k, self.corrupt, self.tree = k, corrupt, tree
        self.g = torch.Generator().manual_seed(seed)

    def greedy(self, n: int) -> list[int]:
        pos = len(self.seq) - self.prompt_len
        return (self.reference[pos:] + [0] * n)[:n]

    def propose(self, warp, generator) -> DraftTree:
        good = self.greedy(self.k)
        toks = [t if float(torch.rand((), generator=self.g)) > self.corrupt
                else int(torch.randint(0, self.vocab, (1,), generator=self.g)) for t in good]
        if not self.tree:
            return DraftTree.chain(torch.tensor(toks))
        tokens, parents = [], []
        prev = -1
        for t in toks:
            other = (t + 1 + int(torch.randint(0, self.vocab - 1, (1,), generator=self.g))) % self.vocab
            order = [t, other] if float(torch.rand((), generator=self.g)) < 0.5 else [other, t]
            idx = {}
            for tok in order:
                idx[tok] = len(tokens)
                tokens.append(tok)
                parents.append(prev)
            tokens.append(int(torch.randint(0, self.vocab, (1,), generator=self.g)))  # child of the distractor
            parents.append(idx[other])
            prev = idx[t]
        return _tree(tokens, parents)


class ScriptedProposer(_Tracking):
    """Chains of ``k`` whose first ``script[i]`` tokens are the reference greedy continuation."""

    def __init__(self, reference: list[int], prompt_len: int, script: list[int], k: int, vocab: int):
        super().__init__()
        self.reference, self.prompt_len, self.script, self.k, self.vocab = reference, prompt_len, script, k, vocab
        self.step = 0

    def propose(self, warp, generator) -> DraftTree:
        pos = len(self.seq) - self.prompt_len  # index in reference of the next token
        good = self.script[self.step]
        self.step += 1
        toks = [self.reference[pos + i] if i < good else (self.reference[pos + i] + 1) % self.vocab
                for i in range(self.k)]
        return DraftTree.chain(torch.tensor(toks), entropy=torch.arange(self.k, dtype=torch.float64))


def _tree(tokens, parents) -> DraftTree:
    depths = []
    for p in parents:
        depths.append(1 if p < 0 else depths[p] + 1)
    n = len(tokens)
    ones = torch.ones(n, dtype=torch.float64)
    return DraftTree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(depths), ones, ones, ones * 0)


@pytest.fixture(autouse=False)
def one_thread():
    """Tiny-model tests are dominated by per-op overhead: one intra-op thread is several times faster
    on a shared 2-core machine."""
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
