"""Data parallelism for the draft training jobs (torch.distributed, launched by
`torchrun --nproc_per_node=N`): the few collectives engine/training/gpu_job_dspark.py needs.

Every rank holds the whole draft and its own shard of the training rows' features (so N GPUs hold N
times the features), samples its own batches and averages the gradients with one all_reduce per
step. A single process (WORLD_SIZE unset or 1) is a `World` of size 1: every helper is then a no-op
that issues no collective, so the single-GPU job runs exactly as without this module.

The hazard of data parallelism is a deadlock: every rank must issue the same collectives in the
same order. Decisions taken from local state (the time budget, an out-of-memory step) therefore go
through `agree_max` before anyone acts on them.
"""
from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence, TypeVar

import torch
import torch.distributed as dist

T = TypeVar("T")


@dataclass(frozen=True)
class World:
    """This process's place among the ranks (torchrun's WORLD_SIZE, RANK, LOCAL_RANK)."""

    size: int = 1
    rank: int = 0
    local_rank: int = 0

    @property
    def active(self) -> bool:
        """More than one rank: the collectives below do something."""
        return self.size > 1

    @property
    def main(self) -> bool:
        """Rank 0 logs, writes the shared files (data cache, checkpoints, metrics) and evaluates."""
        return self.rank == 0


def world_from_env() -> World:
    """The world torchrun describes in the environment; a plain `python -m` run is a world of one."""
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if size <= 1:
        return World()
    return World(size, int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")))


def rank_device(world: World, device_arg: str) -> torch.device:
    """--device for this rank: "auto" / "cuda" become cuda:LOCAL_RANK when several ranks share a
    host (one GPU each); "cpu" (the gloo tests) and an explicit "cuda:i" stay as given."""
    if device_arg == "auto":
        device_arg = "cuda" if torch.cuda.is_available() else "cpu"
    if device_arg == "cuda" and world.active:
        device_arg = f"cuda:{world.local_rank}"
    return torch.device(device_arg)


def init(world: World, dev: torch.device) -> None:
    """Join the process group: NCCL between GPUs, gloo on CPU (tests)."""
    if not world.active:
        return
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if dev.type == "cuda" else "gloo", rank=world.rank, world_size=world.size)


def close(world: World) -> None:
    """Leave the process group (every rank, also after an error, so torch does not warn of a leak)."""
    if world.active and dist.is_initialized():
        dist.destroy_process_group()


def barrier(world: World) -> None:
    """Wait for every rank (e.g. while rank 0 alone writes the data cache or evaluates)."""
    if world.active:
        dist.barrier()


def shard(items: Sequence[T], world: World) -> list[T]:
    """This rank's share: every size-th item from its rank on (the whole list in a world of one)."""
    return list(items[world.rank :: world.size]) if world.active else list(items)


def gather_dicts(world: World, local: dict[str, Any]) -> dict[str, Any]:
    """Every rank's dict merged on every rank (the answers each rank generated for its share of rows)."""
    if not world.active:
        return local
    parts: list[Any] = [None] * world.size
    dist.all_gather_object(parts, local)
    merged: dict[str, Any] = {}
    for p in parts:
        merged.update(p)
    return merged


def gather_objects(world: World, obj: Any) -> list[Any]:
    """Every rank's object, in rank order, on every rank ([obj] in a world of one)."""
    if not world.active:
        return [obj]
    parts: list[Any] = [None] * world.size
    dist.all_gather_object(parts, obj)
    return parts


def agree_max(world: World, values: Sequence[float], dev: torch.device) -> list[float]:
    """The largest of each value over the ranks: one small all_reduce, so that decisions taken from
    local state (progress of the time budget, an out-of-memory or failed step) are the same on all."""
    if not world.active:
        return list(values)
    t = torch.tensor([float(v) for v in values], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.tolist()


def mean_over_ranks(world: World, values: dict[str, Any], dev: torch.device) -> dict[str, Any]:
    """The mean of each value over the ranks (the logged losses; every rank has the same keys in the
    same order, as the same code filled them)."""
    if not world.active:
        return values
    t = torch.tensor([float(v) for v in values.values()], dtype=torch.float64, device=dev)
    dist.all_reduce(t)
    return dict(zip(values, (t / world.size).tolist()))


def broadcast_module(world: World, module: torch.nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank, so that all start from identical weights."""
    if not world.active:
        return
    with torch.no_grad():
        for t in list(module.parameters()) + list(module.buffers()):
            dist.broadcast(t.data, src=0)


def average_gradients(world: World, params: Sequence[torch.nn.Parameter]) -> None:
    """Average the gradients over the ranks with one all_reduce of a flat float32 buffer. A parameter
    without a gradient counts as zeros; one flag per parameter travels in the same buffer, so that a
    parameter no rank touched keeps grad None (AdamW then skips it, as in a single process) while one
    that some rank touched gets the average on every rank (the ranks stay identical)."""
    if not world.active:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    dev = params[0].device
    flat = torch.cat([(p.grad.detach().reshape(-1).float() if p.grad is not None
                       else torch.zeros(p.numel(), dtype=torch.float32, device=dev)) for p in params]
                     + [torch.tensor([float(p.grad is not None) for p in params], dtype=torch.float32, device=dev)])
    dist.all_reduce(flat)
    flags = flat[-len(params):].tolist()
    flat = flat[: -len(params)] / world.size
    off = 0
    for p, flag in zip(params, flags):
        n = p.numel()
        if flag > 0:
            g = flat[off : off + n].view_as(p).to(p.dtype)
            if p.grad is None:
                p.grad = g.clone()
            else:
                p.grad.copy_(g)
        off += n


def params_sha256(module: torch.nn.Module) -> str:
    """A checksum of the weights (float32 bytes in state_dict order): ranks must agree after training."""
    h = hashlib.sha256()
    for k, v in module.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().float().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class RankLog:
    """The log of a rank other than 0: its own file (out/log.rankN.txt), no console output (torchrun
    merges every rank's stdout; rank 0's FileLog already reports there)."""

    def __init__(self, path: Path) -> None:
        self.t0 = time.time()
        self.path = path

    def __call__(self, msg: str) -> None:
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(f"[{time.time() - self.t0:7.1f}s] {msg}\n")
