"""FSDP2 wrapping, and full state dicts gathered to and loaded from rank 0."""

from __future__ import annotations

from typing import Any, Mapping

import torch


def _no_split_classes(model: torch.nn.Module) -> set[str]:
    """Class names of the blocks to shard one by one (HF's ``_no_split_modules``: the decoder layers)."""
    names: set[str] = set()
    for m in model.modules():
        for n in getattr(m, "_no_split_modules", None) or []:
            names.add(n)
    return names


def apply_fsdp(model: torch.nn.Module, mixed_precision: str | None = None) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2: each decoder layer, then the root. Returns the model.

    ``mixed_precision``: ``None`` (params and compute in the model's dtype) or ``"bf16"`` / ``"fp16"`` (compute in
    that dtype, gradients reduced in float32).
    """
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kwargs: dict[str, Any] = {}
    if mixed_precision:
        dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
                 "float16": torch.float16}.get(str(mixed_precision))
        if dtype is None:
            raise ValueError(f"trainer.mixed_precision={mixed_precision!r}: use null, bf16 or fp16")
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)
    layer_classes = _no_split_classes(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layer_classes:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model

def _detached(obj: Any) -> Any:
    """A deep copy of the tensors in a (nested) state dict; other values as they are."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return type(obj)((k, _detached(v)) for k, v in obj.items())
    if isinstance(obj, list):
        return [_detached(v) for v in obj]
    if isinstance(obj, tuple):
        return tuple(_detached(v) for v in obj)
    return obj


def gather_full_state(model: torch.nn.Module, rank: int, copy: bool = False) -> dict | None:
    """Full model state dict on rank 0 (CPU); None on the other ranks. A collective.

    ``copy``: detach the result from the live parameters (with one rank and a CPU model the gathered tensors
    can share storage with them, and the next optimizer step would change a saved state).
    """
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_model_state_dict,
    )

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank != 0:
        return None
    return _detached(sd) if copy else sd


def gather_optim_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer, rank: int) -> dict | None:
    """Full optimizer state dict on rank 0 (CPU, detached); None on the other ranks. A collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        get_optimizer_state_dict,
    )

    osd = get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return _detached(osd) if rank == 0 else None


def load_full_state(model: torch.nn.Module, model_sd: Mapping, optimizer: torch.optim.Optimizer | None = None,
                    optim_sd: Mapping | None = None) -> None:
    """Load full (unsharded) state dicts into a sharded model and its optimizer. A collective."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    opts = StateDictOptions(full_state_dict=True)
    set_model_state_dict(model, dict(model_sd), options=opts)
    if optimizer is not None and optim_sd is not None:
        set_optimizer_state_dict(model, optimizer, dict(optim_sd), options=opts)
