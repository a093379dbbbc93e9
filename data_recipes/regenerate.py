"""On-policy data: replace every assistant turn with the target's own response.

Conversations are processed in shards of ``shard_size`` records; each finished shard is written
atomically as JSONL under a work directory, so a killed run resumes from the first missing shard.
Within a shard, turn ``t`` of every conversation is generated in left-padded batches, conditioned on the
user turns and the *regenerated* earlier assistant turns (as the target would see them when serving).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from data_recipes.encoding import RecordEncoder, records_hash
from data_recipes.records import Record

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RegenerateConfig:
    target: str | None = None
    batch_size: int = 16
    max_new_tokens: int = 512
    shard_size: int = 256
    temperature: float = 0.0
    seed: int = 42
    dtype: str = "auto"
    max_prompt_tokens: int = 1536  # a turn whose prompt is longer keeps its text (entry points: --max-length,
    # since training truncates rows there and never sees such a turn)

    def key(self) -> dict:
        return asdict(self)


def _generate_batch(model, tokenizer, prompts: list[str], cfg: RegenerateConfig, generator_seed: int) -> list[str]:
    enc = tokenizer(prompts, add_special_tokens=False, return_tensors="pt", padding=True)
    device = next(model.parameters()).device
    kwargs = {"max_new_tokens": cfg.max_new_tokens, "pad_token_id": tokenizer.pad_token_id,
              "eos_token_id": tokenizer.eos_token_id}
    if cfg.temperature > 0:
        torch.manual_seed(generator_seed)
        kwargs.update(do_sample=True, temperature=cfg.temperature, top_k=0, top_p=1.0)
    else:
        kwargs.update(do_sample=False)
    with torch.no_grad():
        out = model.generate(input_ids=enc["input_ids"].to(device), attention_mask=enc["attention_mask"].to(device),
                             **kwargs)
    new = out[:, enc["input_ids"].shape[1]:].tolist()
    return [tokenizer.decode(ids, skip_special_tokens=True).strip() for ids in new]


def regenerate_shard(model, tokenizer, records: list[Record], cfg: RegenerateConfig, shard_seed: int,
                     stats: dict) -> list[Record]:
    """Regenerate every assistant turn of ``records`` (turn by turn, batched across records)."""
    convs = [list(dict(m) for m in r.messages) for r in records]
    max_turns = max(len(c) for c in convs)
    for t in range(max_turns):
        todo = [i for i, c in enumerate(convs) if t < len(c) and c[t]["role"] == "assistant"]
        prompts, owners = [], []
        for i in todo:
            prompt = tokenizer.apply_chat_template(convs[i][:t], tokenize=False, add_generation_prompt=True)
            if len(tokenizer(prompt, add_special_tokens=False)["input_ids"]) > cfg.max_prompt_tokens:
                stats["kept_original_long_prompt"] += 1
                continue
            prompts.append(prompt)
            owners.append(i)
        for b in range(0, len(prompts), cfg.batch_size):
            answers = _generate_batch(model, tokenizer, prompts[b: b + cfg.batch_size], cfg, shard_seed * 1000 + t)
            for i, answer in zip(owners[b: b + cfg.batch_size], answers):
                if answer:
                    convs[i][t]["content"] = answer
                    stats["regenerated_turns"] += 1
                else:
                    stats["kept_original_empty"] += 1
    return [Record(r.id, r.source, r.domain, tuple(c)) for r, c in zip(records, convs)]


def _write_shard(path: Path, records: list[Record]) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec.to_dict(), ensure_ascii=False) + "\n")
    os.replace(tmp, path)


def _read_shard(path: Path) -> list[Record]:
    with open(path, encoding="utf-8") as fh:
        return [Record.from_dict(json.loads(line)) for line in fh if line.strip()]


def regenerate_all(records: list[Record], cfg: RegenerateConfig, work_dir: Path, *, model=None,
                   tokenizer=None) -> tuple[list[Record], dict]:
    """Regenerate ``records`` shard by shard under ``work_dir`` (resumable). Returns (records, stats)."""
    work_dir = Path(work_dir)
    meta = {"config": cfg.key(), "records": records_hash(records), "count": len(records)}
    meta_path = work_dir / "meta.json"
    if work_dir.exists() and (not meta_path.is_file() or json.loads(meta_path.read_text()) != meta):
        log.info("regeneration work dir %s belongs to other data; starting over", work_dir)
        shutil.rmtree(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    meta_path.write_text(json.dumps(meta, indent=1))
    shards = [records[i: i + cfg.shard_size] for i in range(0, len(records), cfg.shard_size)]
    paths = [work_dir / f"shard-{k:05d}.jsonl" for k in range(len(shards))]
    done = sum(len(s) for s, p in zip(shards, paths) if p.is_file())
    stats = {"regenerated_turns": 0, "kept_original_empty": 0, "kept_original_long_prompt": 0,
             "resumed_rows": done}
    if done < len(records) and model is None:
        from training.target import load_target

        model, tokenizer = load_target(cfg.target, dtype=cfg.dtype)
    if tokenizer is not None:
        tokenizer.padding_side = "left"
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    out: list[Record] = []
    with tqdm(total=len(records), initial=done, desc="regenerating", unit="conv") as bar:
        for k, (shard, path) in enumerate(zip(shards, paths)):
            if path.is_file():
                out += _read_shard(path)
                continue
            new = regenerate_shard(model, tokenizer, shard, cfg, cfg.seed + k, stats)
            _write_shard(path, new)
            out += new
            bar.update(len(shard))
    return out, stats


def regenerate_records(cfg: RegenerateConfig, train: list[Record], heldout: list[Record], *,
                       encoder: RecordEncoder, work_dir: Path, target_name: str | None = None, model=None):
    """Regenerate train + held-out records, re-encode them, drop rows left without assistant tokens."""
    if cfg.target is None and target_name is not None:
        cfg = RegenerateConfig(**{**cfg.key(), "target": target_name})
    new, stats = regenerate_all(train + heldout, cfg, work_dir, model=model,
                                tokenizer=encoder.tokenizer if model is not None else None)
    out = []
    dropped = 0
    for part in (new[: len(train)], new[len(train):]):
        recs, encs = [], []
        for rec in part:
            enc = encoder.encode(rec)
            if enc is None:
                dropped += 1
                continue
            recs.append(rec)
            encs.append(enc)
        out.append((recs, encs))
    stats["dropped_no_assistant_token"] = dropped
    stats["config"] = cfg.key()
    (train_r, train_e), (held_r, held_e) = out
    return train_r, held_r, train_e, held_e, stats
