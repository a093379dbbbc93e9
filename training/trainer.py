"""The training loop: steps, held-out evaluation, checkpoints, NaN stop, final export.

``Trainer(cfg).run()`` is what ``launch/train_drafter.py`` calls. Tests pass a tiny ``target``
(a FrozenTarget) and a ``data`` object with ``.train``/``.heldout``/``.manifest`` instead.
"""

from __future__ import annotations

import json
import logging
import math
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from training import backend, checkpointing, lifecycle
from training.config import TrainConfig
from training.data import TrainStream, eval_batches
from training.losses import LossWeights
from training.step import eval_counts, summarize_counts, train_losses

log = logging.getLogger(__name__)
_EVAL_CACHE_ELEMENTS = 128 * 2**20  # held-out features kept in memory up to this many values


class TrainingDiverged(RuntimeError):
    """The loss became NaN or infinite; the run stopped without writing a checkpoint."""


class Trainer:
    def __init__(self, cfg: TrainConfig, *, target=None, data=None):
        cfg.validate()
        self.cfg = cfg
        from training.target import default_device

        self.device = default_device()
        self.rank, self.world = backend.init_distributed(self.device)
        self.out = lifecycle.check_output_dir(cfg)
        if target is None:
            target, tokenizer = lifecycle.load_frozen_target(cfg)
            lifecycle.check_chat_template(tokenizer, cfg)
            data = data if data is not None else lifecycle.load_data(cfg, tokenizer)
        self.target = target.to(self.device)
        self.data = data
        self.bf16 = self.device.type == "cuda" and torch.cuda.is_bf16_supported()
        weights = LossWeights(cfg.feature_weight, cfg.prob_weight,
                              cfg.topk_weight if cfg.objective == "hass" else 0.0, cfg.topk)
        self.weights = weights
        self.store = self._feature_store()
        self.stream = TrainStream(data.train, tokens_per_batch=cfg.tokens_per_batch, seed=cfg.seed,
                                  rank=self.rank, world=self.world, grad_accum=cfg.grad_accum,
                                  feature_store=self.store)
        self.total_steps = cfg.max_steps or max(1, math.ceil(cfg.epochs * self.stream.steps_per_epoch))
        model, self.drafter_config = lifecycle.build_drafter(cfg, self.target)
        self.lora = cfg.lora_r > 0
        self.engine = backend.build_engine(model, cfg, self.total_steps, self.bf16)
        self.step, self.tokens, self.history = 0, 0, {}
        self._eval_cache: list | None = None
        self._resume()

    # ----------------------------------------------------------------- set-up helpers
    def _feature_store(self):
        if self.cfg.features != "offline":
            return None
        from data_recipes.features import FeatureStore, default_feature_dir

        info = self.target.info()
        return FeatureStore(self.cfg.feature_dir or default_feature_dir(info), target_info=info)

    def _resume(self) -> None:
        if self.cfg.resume is None:
            return
        for path in checkpointing.resume_candidates(self.out, self.cfg.resume):
            try:
                state = checkpointing.load_checkpoint(self.engine, path)
            except Exception as err:  # a damaged engine file: fall back to the previous checkpoint
                self._say(f"WARNING: could not load checkpoint {path} ({err}); trying the previous one")
                continue
            self.step, self.tokens = int(state["step"]), int(state["tokens"])
            self.history = state.get("history", {})
            self._say(f"resumed from {path} at step {self.step}")
            return
        self._say(f"no complete checkpoint in {self.out / 'checkpoints'}: starting fresh")

    def _say(self, msg: str) -> None:
        if self.rank == 0:
            print(msg, flush=True)

    # ----------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """Held-out loss, top-1 per depth and EAL, summed over ranks (independent of rank count)."""
        cfg = self.cfg
        self.engine.eval()
        mine = self._eval_cache or list(eval_batches(
            self.data.heldout, tokens_per_batch=cfg.tokens_per_batch, rank=self.rank, world=self.world,
            limit=cfg.eval_rows, feature_store=self.store))
        if self._eval_cache is None and sum(b.input_ids.numel() for b in mine) * self.target.config.hidden_size \
                <= _EVAL_CACHE_ELEMENTS:  # small held-out sets: compute the target's features once
            for b in mine:
                if b.features is None:
                    b.features = self.target.features(b.input_ids.to(self.device)).cpu()
            self._eval_cache = mine
        n_max = backend.all_reduce_max(len(mine))
        total = torch.zeros(2 + 4 * cfg.eval_depth, dtype=torch.float64)
        filler = mine[0] if mine else next(eval_batches(self.data.heldout, tokens_per_batch=cfg.tokens_per_batch,
                                                        rank=0, world=1, limit=1, feature_store=self.store))
        for i in range(n_max):  # every rank runs the same number of forwards (ZeRO-3 gathers)
            batch = (mine[i] if i < len(mine) else filler).to(self.device)
            counts = eval_counts(self.engine, self.target, batch, depth=cfg.eval_depth, weights=self.weights,
                                 chunk=cfg.loss_chunk)
            if i < len(mine):
                total += counts
        self.engine.train()
        return summarize_counts(backend.all_reduce_sum(total), cfg.eval_depth)

    # ----------------------------------------------------------------- the loop
    def run(self) -> dict:
        cfg = self.cfg
        from training.reporting import Reporter

        reporter = Reporter(cfg.report_to, self.out, cfg.name, cfg.to_dict(), enabled=self.rank == 0)
        if self.step == 0 and cfg.eval_at_start:
            self.history["untrained"] = self.evaluate()
            self._say(f"held-out before training: EAL {self.history['untrained']['eal']:.4f}")
        batches = self.stream.micro_batches(self.step)
        bar = tqdm(total=self.total_steps, initial=self.step, disable=self.rank != 0, desc="training",
                   unit="step", dynamic_ncols=True)
        started, tokens_at_start = time.perf_counter(), self.tokens
        try:
            while self.step < self.total_steps:
                parts = self._optimizer_step(batches)
                self.step += 1
                rate = (self.tokens - tokens_at_start) * 1.0 / max(1e-9, time.perf_counter() - started)
                bar.set_postfix(loss=f"{parts['loss']:.4f}", tok_s=f"{rate:.0f}")
                bar.update(1)
                if self.step % cfg.log_every == 0:
                    reporter.log({"train": parts, "lr": self.engine.get_lr()[0], "tokens_per_s": rate},
                                 self.step)
                last = self.step == self.total_steps
                if self.step % cfg.eval_every == 0 or last:
                    self.history["last"] = {**self.evaluate(), "step": self.step}
                    reporter.log({"heldout": self.history["last"]}, self.step)
                if self.step % cfg.save_every == 0 or last:
                    self._save()
        finally:
            bar.close()
            reporter.close()
        return self._finish()

    def _optimizer_step(self, batches) -> dict:
        cfg = self.cfg
        sums: dict[str, float] = {}
        for _ in range(cfg.grad_accum):
            batch = next(batches)
            self.tokens += batch.num_tokens * self.world
            batch = batch.to(self.device)
            parts = train_losses(self.engine, self.target, batch, passes=cfg.passes, weights=self.weights,
                                 noise=cfg.noise, chunk=cfg.loss_chunk)
            loss = parts["loss"]
            if backend.any_rank(not bool(torch.isfinite(loss.detach()).all())):
                newest = checkpointing.resume_candidates(self.out)
                keep = f"the last good checkpoint is {newest[0]}" if newest else "no checkpoint was written yet"
                raise TrainingDiverged(
                    f"training loss became {float(loss.detach()):.4g} (NaN/inf) at step {self.step + 1} on at least one "
                    f"rank; stopping without saving; {keep}. Lower --lr, check the data and the target, then "
                    "rerun with --resume auto")
            self.engine.backward(loss)
            self.engine.step()
            for key, value in parts.items():
                sums[key] = sums.get(key, 0.0) + float(value.detach()) / cfg.grad_accum
        return sums

    def _state(self) -> dict:
        return {"step": self.step, "tokens": self.tokens, "world_size": self.world, "history": self.history}

    def _save(self) -> None:
        self.last_checkpoint = checkpointing.save_checkpoint(
            self.engine, self.out, self.step, self._state(), self.cfg, self.lora, self.cfg.keep_last)

    def _write_token_counts(self) -> None:
        """Counts of the trained tokens beside the final drafter (for draft vocabularies, eval/draft_vocab.py)."""
        from checkpoints.token_counts import count_trained_tokens, save_token_counts

        train = getattr(self.data, "train", None)
        if train is not None and "loss_mask" in getattr(train, "column_names", ()):
            save_token_counts(count_trained_tokens(train, self.target.info().vocab_size), self.out)

    def _finish(self) -> dict:
        metrics = {"step": self.step, "tokens": self.tokens, **self.history}
        if self.rank == 0:
            manifest = getattr(self.data, "manifest", {}) or {}
            checkpointing.write_final(self.out, self.last_checkpoint, {
                "manifest.json": json.dumps(manifest, indent=2, default=str),
                "metrics.json": json.dumps(metrics, indent=2)})
            self._write_token_counts()
            before = self.history.get("untrained", {}).get("eal")
            after = self.history.get("last", {}).get("eal")
            if before is not None and after is not None:
                print(f"held-out EAL: untrained {before:.4f} -> trained {after:.4f} "
                      f"({after - before:+.4f}) after {self.step} steps", flush=True)
            print(f"final drafter: {self.out.resolve()}  (metrics: {self.out.resolve() / 'metrics.json'})",
                  flush=True)
            if self.cfg.push_to_hub:
                from checkpoints.hub import push_drafter

                push_drafter(Path(self.out), self.cfg.push_to_hub)
        backend.barrier()
        return metrics

