"""The typed training configuration: one dataclass, the flags, ``--config run.yaml`` and its checks.

Every field is a flag (``--zero-stage`` for ``zero_stage``) with a default and a help text. A YAML
file given with ``--config`` sets fields; flags given on the command line override it; unknown
keys are errors. The resolved configuration is saved as ``training_config.yaml`` in every
checkpoint. The defaults are for short fresh runs on CPU (see docs/training.md for the HASS
fine-tuning recipe on GPUs).
"""

from __future__ import annotations

import argparse
import dataclasses
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

CONFIG_NAME = "training_config.yaml"


def _f(default: Any, help: str, choices: tuple | None = None):
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class TrainConfig:
    # run and data
    name: str = _f("drafter", "run name; the default output directory is runs/<name>")
    output_dir: str | None = _f(None, "where checkpoints and the final drafter go (default runs/<name>)")
    mix: str = _f("balanced", "data mixture: math, chat, balanced or large")
    scale: float = _f(1.0, "fraction of the mixture's rows to use (0.01 = 1%)")
    data_dir: str | None = _f(None, "offline data directory (default $TAPS_DATA_DIR)")
    max_length: int = _f(512, "maximum tokens per training row (2048 in the HASS recipe on GPUs)")
    seed: int = _f(42, "seed of data order, noise and the fresh drafter's initialisation")
    chat_template: str | None = _f(None, "a Jinja chat-template file for tokenizers that have none")
    regenerate: bool = _f(False, "train on on-policy data: every assistant turn replaced by the target's own "
                                 "response (cached; run launch/prepare_data.py --regenerate first for big mixes)")
    regen_batch_size: int = _f(16, "prompts per batched generate() call when regenerating")
    regen_max_new_tokens: int = _f(512, "longest regenerated assistant turn")
    regen_temperature: float = _f(0.0, "sampling temperature of the regenerated turns (0 = greedy)")
    regen_dtype: str = _f("auto", "dtype of the target while regenerating: auto, float32, bfloat16")
    # target and features
    target: str = _f("smollm2-135m-instruct", "target model: Hub id, local directory or the default")
    target_dtype: str = _f("auto", "target dtype: auto (bf16 on capable GPUs, fp32 on CPU), float32, bfloat16")
    features: str = _f("online", "target features: computed per batch (online) or from the offline cache",
                       ("online", "offline"))
    feature_dir: str | None = _f(None, "offline feature cache directory (default: the shared cache)")
    # objective
    objective: str = _f("hass", "training objective", ("hass", "eagle"))
    hass_passes: int = _f(3, "HASS context-alignment passes per batch (eagle uses 1)")
    feature_weight: float = _f(1.0, "weight of the SmoothL1 feature loss")
    prob_weight: float = _f(0.1, "weight of the full-vocabulary soft cross-entropy")
    topk_weight: float = _f(1.0, "weight of the HASS Top-K distillation loss (hass only)")
    topk: int = _f(10, "K of the Top-K distillation loss")
    noise: float = _f(0.2, "width of the uniform noise added to input features (0.2 = U(-0.1, 0.1))")
    loss_chunk: int = _f(1024, "positions per chunk of the vocabulary-sized losses (bounds memory)")
    # optimisation
    zero_stage: int = _f(2, "DeepSpeed ZeRO stage (launch/configs/zero<N>.json)", (0, 1, 2, 3))
    lr: float = _f(1e-3, "peak learning rate (fresh CPU runs; HASS fine-tuning uses 3e-5)")
    min_lr_ratio: float = _f(0.1, "final learning rate as a fraction of the peak")
    schedule: str = _f("cosine", "decay after warm-up", ("cosine", "linear", "constant"))
    warmup_ratio: float = _f(0.05, "warm-up steps as a fraction of all steps")
    weight_decay: float = _f(0.0, "AdamW weight decay")
    adam_beta1: float = _f(0.9, "AdamW beta1")
    adam_beta2: float = _f(0.95, "AdamW beta2")
    grad_clip: float = _f(0.5, "gradient clipping by GLOBAL NORM (DeepSpeed gradient_clipping); 0 = off")
    tokens_per_batch: int = _f(512, "tokens per micro-batch per rank (rows padded to the longest)")
    grad_accum: int = _f(1, "micro-batches accumulated per optimizer step")
    epochs: float = _f(1.0, "passes over the training data (ignored when --max-steps is set)")
    max_steps: int | None = _f(None, "stop after this many optimizer steps")
    # evaluation, logging, checkpoints
    eval_every: int = _f(50, "held-out evaluation every N steps (and at the end)")
    eval_depth: int = _f(3, "draft depths measured on held-out data (top-1 per depth, EAL)")
    eval_rows: int | None = _f(None, "use at most this many held-out rows")
    eval_at_start: bool = _f(True, "also evaluate the untrained drafter before step 1")
    save_every: int = _f(100, "checkpoint every N steps (and at the end)")
    keep_last: int = _f(2, "keep the last K step checkpoints")
    resume: str | None = _f(None, "'auto' (newest complete checkpoint) or a checkpoint directory")
    overwrite: bool = _f(False, "replace an output directory that holds another run")
    init_from: str | None = _f(None, "warm-start from an existing drafter directory")
    lora_r: int = _f(0, "train a LoRA adapter of this rank with peft instead of all weights (0 = off)")
    lora_alpha: int = _f(16, "LoRA alpha")
    report_to: str = _f("none", "experiment tracker", ("none", "wandb", "tensorboard"))
    log_every: int = _f(10, "log scalars every N steps")
    push_to_hub: str | None = _f(None, "after training, upload the final drafter to this Hub repo (ORG/NAME)")

    def resolved_output_dir(self) -> Path:
        return Path(self.output_dir) if self.output_dir else Path("runs") / self.name

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def save(self, directory: str | Path) -> Path:
        path = Path(directory) / CONFIG_NAME
        path.write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))
        return path

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str = "config") -> TrainConfig:
        cfg = cls()
        cfg.update(data, source)
        return cfg

    def update(self, data: dict[str, Any], source: str = "config") -> None:
        known = {f.name: f for f in dataclasses.fields(self)}
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ValueError(f"{source}: unknown training option(s) {unknown}; known: {sorted(known)}")
        for key, value in data.items():
            setattr(self, key, _coerce(known[key], value, source))
        self.validate()

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            if choices and getattr(self, f.name) not in choices:
                raise ValueError(f"{f.name} must be one of {list(choices)}, got {getattr(self, f.name)!r}")
        positive = ("tokens_per_batch", "grad_accum", "eval_every", "save_every", "keep_last", "max_length",
                    "eval_depth", "hass_passes", "loss_chunk", "log_every")
        for key in positive:
            if getattr(self, key) < 1:
                raise ValueError(f"{key} must be >= 1, got {getattr(self, key)}")
        if self.max_steps is not None and self.max_steps < 1:
            raise ValueError(f"max_steps must be >= 1, got {self.max_steps}")
        if self.lr <= 0 or self.epochs <= 0:
            raise ValueError("lr and epochs must be > 0")
        if self.resume not in (None, "auto") and not Path(self.resume).exists():
            raise ValueError(f"resume must be 'auto' or an existing checkpoint directory, got {self.resume!r}")

    @property
    def passes(self) -> int:
        return self.hass_passes if self.objective == "hass" else 1


def _base_type(f: dataclasses.Field) -> type:
    hint = typing.get_type_hints(TrainConfig)[f.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def _coerce(f: dataclasses.Field, value: Any, source: str) -> Any:
    if value is None:
        return None
    kind = _base_type(f)
    try:
        if kind is bool:
            if isinstance(value, str):
                if value.lower() not in ("true", "false", "1", "0", "yes", "no"):
                    raise ValueError(value)
                return value.lower() in ("true", "1", "yes")
            return bool(value)
        return kind(value)
    except (TypeError, ValueError):
        raise ValueError(f"{source}: option {f.name} expects {kind.__name__}, got {value!r}") from None


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description="Train an EAGLE/HASS drafter with DeepSpeed (docs/training.md).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    parser.add_argument("--config", default=None, help="a YAML file of options; flags override it")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=-1,
                        help="set by the deepspeed launcher (do not pass by hand)")
    for f in dataclasses.fields(TrainConfig):
        flag = "--" + f.name.replace("_", "-")
        kind = _base_type(f)
        kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                  "help": f"{f.metadata['help']} (default: {f.default})".replace("%", "%%")}
        if kind is bool:
            kwargs["action"] = argparse.BooleanOptionalAction
        else:
            kwargs["type"] = kind
            if f.metadata.get("choices"):
                kwargs["choices"] = f.metadata["choices"]
        parser.add_argument(flag, **kwargs)
    return parser


def parse_config(argv: list[str] | None = None) -> TrainConfig:
    """Defaults < ``--config`` YAML < command-line flags."""
    args = vars(build_parser().parse_args(argv))
    config_path = args.pop("config")
    args.pop("local_rank")
    cfg = TrainConfig()
    if config_path:
        path = Path(config_path)
        if not path.is_file():
            raise FileNotFoundError(f"--config {path}: no such file")
        data = yaml.safe_load(path.read_text()) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{path}: expected a mapping of options")
        cfg.update({k.replace("-", "_"): v for k, v in data.items()}, str(path))
    cfg.update(args, "command line")
    return cfg
