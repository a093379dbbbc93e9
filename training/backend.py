"""The DeepSpeed side: process group, ZeRO config, engine with torch AdamW and the LR schedule.

Works the same under ``deepspeed --num_gpus N`` / ``--hostfile``, ``torchrun`` and plain ``python``
(one process: a single-rank group is created). CUDA uses NCCL, CPU uses gloo. The optimizer is
``torch.optim.AdamW`` passed as a client optimizer, so nothing is compiled at start-up; ZeRO
partitions its state. Gradient clipping is DeepSpeed's ``gradient_clipping``: by GLOBAL NORM.
"""

from __future__ import annotations

import copy
import json
import math
import os
import socket
from pathlib import Path

import torch
import torch.distributed as dist

CONFIG_DIR = Path(__file__).resolve().parents[1] / "launch" / "configs"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def init_distributed(device: torch.device) -> tuple[int, int]:
    """Join (or create) the process group; returns (rank, world size)."""
    import deepspeed

    if not dist.is_initialized():
        if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:  # plain `python`: one rank
            os.environ.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"})
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", str(_free_port()))
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cpu" and os.environ.get("TAPS_DS_SHM_COMM", "0") != "1":
            # gloo needs no extra op; skipping DeepSpeed's shared-memory comm op avoids compiling it
            # (~1-2 minutes) on the first CPU run. TAPS_DS_SHM_COMM=1 keeps it.
            import deepspeed.ops

            deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
        deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False,
                                   verbose=False)
    if device.type == "cpu" and "OMP_NUM_THREADS" not in os.environ:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // max(1, local)))  # no oversubscription
    return dist.get_rank(), dist.get_world_size()


def rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


def barrier() -> None:
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.barrier()


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over ranks (on CPU tensors for gloo; float64 kept exact for counts)."""
    if dist.is_initialized() and dist.get_world_size() > 1:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_max(n: int) -> int:
    t = torch.tensor([float(n)], dtype=torch.float64)
    if dist.is_initialized() and dist.get_world_size() > 1:
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def any_rank(flag: bool) -> bool:
    return bool(all_reduce_sum(torch.tensor([1.0 if flag else 0.0], dtype=torch.float64)).item() > 0)


def deepspeed_config(zero_stage: int, *, grad_accum: int, grad_clip: float, bf16: bool) -> dict:
    """The ZeRO config file ``launch/configs/zero<stage>.json`` with its "auto" values filled in."""
    path = CONFIG_DIR / f"zero{zero_stage}.json"
    if not path.is_file():
        raise FileNotFoundError(f"DeepSpeed config {path} is missing (zero_stage={zero_stage})")
    cfg = copy.deepcopy(json.loads(path.read_text()))
    fill = {"gradient_accumulation_steps": grad_accum, "gradient_clipping": float(grad_clip)}
    for key, value in fill.items():
        if cfg.get(key, "auto") == "auto":
            cfg[key] = value
    if cfg.get("bf16", {}).get("enabled", "auto") == "auto":
        cfg["bf16"] = {**cfg.get("bf16", {}), "enabled": bool(bf16)}
    return cfg


def lr_lambda(total_steps: int, warmup_steps: int, schedule: str, min_ratio: float):
    """Linear warm-up to 1, then cosine / linear decay to ``min_ratio`` (or constant)."""

    def fn(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / max(1, warmup_steps)
        if schedule == "constant":
            return 1.0
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        shape = 0.5 * (1 + math.cos(math.pi * progress)) if schedule == "cosine" else 1 - progress
        return min_ratio + (1 - min_ratio) * shape

    return fn


def build_engine(model: torch.nn.Module, cfg, total_steps: int, bf16: bool):
    """``deepspeed.initialize`` with torch AdamW (betas from the config) and a LambdaLR schedule."""
    import deepspeed

    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.lr, betas=(cfg.adam_beta1, cfg.adam_beta2),
                                  weight_decay=cfg.weight_decay)
    warmup = int(round(cfg.warmup_ratio * total_steps))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lr_lambda(total_steps, warmup, cfg.schedule, cfg.min_lr_ratio))
    ds_cfg = deepspeed_config(cfg.zero_stage, grad_accum=cfg.grad_accum, grad_clip=cfg.grad_clip, bf16=bf16)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_cfg, model_parameters=params)
    return engine
