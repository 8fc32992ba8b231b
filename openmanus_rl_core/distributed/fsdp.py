"""How the ranks of a group hold a model (FSDP2 full shard, gradients and optimizer sharded, or a replica per rank),
and full state dicts gathered to and loaded from rank 0."""

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


def _mp_policy(mixed_precision: str | None) -> dict[str, Any]:
    if not mixed_precision:
        return {}
    from torch.distributed.fsdp import MixedPrecisionPolicy

    dtype = {"bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16,
             "float16": torch.float16}.get(str(mixed_precision))
    if dtype is None:
        raise ValueError(f"trainer.mixed_precision={mixed_precision!r}: use null, bf16 or fp16")
    return {"mp_policy": MixedPrecisionPolicy(param_dtype=dtype, reduce_dtype=torch.float32)}


def apply_fsdp(model: torch.nn.Module, mixed_precision: str | None = None,
               reshard_after_forward: bool = True) -> torch.nn.Module:
    """Shard ``model`` in place with FSDP2: each decoder layer, then the root. Returns the model.

    ``mixed_precision``: ``None`` (params and compute in the model's dtype) or ``"bf16"`` / ``"fp16"`` (compute in
    that dtype, gradients reduced in float32). ``reshard_after_forward=False`` keeps the gathered parameters
    between forward and backward (and, with :class:`GradOpSharding`, across a step's micro-batches).
    """
    from torch.distributed.fsdp import fully_shard

    kwargs = dict(_mp_policy(mixed_precision), reshard_after_forward=reshard_after_forward)
    layer_classes = _no_split_classes(model)
    for module in list(model.modules()):
        if module is not model and type(module).__name__ in layer_classes:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


class FullSharding:
    """FSDP2 full shard: parameters, gradients and optimizer state sharded; every micro-batch gathers each layer
    (forward and backward) and reduce-scatters its gradients."""

    name = "full"
    # False: the parameters are sharded, so a forward pass is a collective (every rank runs the same number) and
    # a weight sync gathers them. True: every rank holds the same whole weights, and neither needs a collective.
    whole_on_every_rank = False

    def wrap(self, model: torch.nn.Module, mixed_precision: str | None) -> torch.nn.Module:
        return apply_fsdp(model, mixed_precision)

    def before_backward(self, model: torch.nn.Module, last: bool) -> None:
        """Called before each micro-batch's forward; ``last``: the step's final micro-batch."""

    def sync_grads(self, model: torch.nn.Module) -> None:
        """Called once per optimizer step, after the last backward (FSDP2 reduced the gradients already)."""

    def after_step(self, model: torch.nn.Module) -> None:
        """Called after each optimizer step and after no-grad forward passes."""


class GradOpSharding(FullSharding):
    """Gradients and optimizer state sharded (ZeRO-2): the parameters are gathered at a step's first forward and
    kept until its last backward, which alone reduce-scatters the accumulated gradients."""

    name = "grad_op"

    def wrap(self, model: torch.nn.Module, mixed_precision: str | None) -> torch.nn.Module:
        return apply_fsdp(model, mixed_precision, reshard_after_forward=False)

    def before_backward(self, model: torch.nn.Module, last: bool) -> None:
        model.set_requires_gradient_sync(last)
        model.set_reshard_after_backward(last)

    def after_step(self, model: torch.nn.Module) -> None:
        from torch.distributed.fsdp import FSDPModule

        for m in model.modules():  # the new shards are gathered again at the next forward
            if isinstance(m, FSDPModule):
                m.reshard()


class ReplicateSharding(FullSharding):
    """A whole copy of the model on every rank (no collective in forward or backward); the gradients are averaged
    over the ranks in one all-reduce of one flat buffer per optimizer step."""

    name = "replicate"
    whole_on_every_rank = True

    def wrap(self, model: torch.nn.Module, mixed_precision: str | None) -> torch.nn.Module:
        import torch.distributed as dist

        if mixed_precision:
            raise ValueError(f"sharding=replicate: trainer.mixed_precision={mixed_precision!r} needs an FSDP2 "
                             f"sharding (full or grad_op)")
        if dist.get_world_size() > 1:  # every rank starts from rank 0's tensors (e.g. randomly initialised adapters)
            tensors = [t.data for t in [*model.parameters(), *model.buffers()]]
            flat = torch.cat([t.reshape(-1).to(torch.float64) for t in tensors])
            dist.broadcast(flat, src=0)
            for t, v in zip(tensors, flat.split([t.numel() for t in tensors])):
                t.copy_(v.view_as(t))
        return model

    def sync_grads(self, model: torch.nn.Module) -> None:
        import torch.distributed as dist

        world = dist.get_world_size()
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        if world == 1 or not grads:
            return
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat)
        flat /= world
        for g, v in zip(grads, flat.split([g.numel() for g in grads])):
            g.copy_(v.view_as(g))


SHARDINGS = {s.name: s for s in (FullSharding, GradOpSharding, ReplicateSharding)}


def choose_sharding(choice: str, model: torch.nn.Module, device: torch.device, world_size: int,
                    mixed_precision: str | None, memory_bytes: int | None = None) -> tuple[FullSharding, str]:
    """The sharding ``choice`` names, or for ``auto`` the least communication that fits a rank's memory; returns it
    and a one-line reason.

    A replica's training state (fp32 AdamW): parameters + 3 x trainable (gradient, two moments). ``auto`` replicates
    when that is at most a quarter of a rank's memory (the rest: activations, the engine's copy, the reference),
    else shards gradients and optimizer when parameters + 3 x trainable / ranks fit that quarter, else full.
    ``memory_bytes``: a rank's memory (default: the GPU's, or the machine's divided among ``world_size`` ranks).
    """
    if choice != "auto":
        return SHARDINGS[choice](), "chosen"
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    trainable = sum(p.numel() * 4 for p in model.parameters() if p.requires_grad)
    if memory_bytes is None:
        memory_bytes = rank_memory(device, world_size)
    budget = memory_bytes // 4
    replica, zero2 = params + 3 * trainable, params + 3 * trainable // max(1, world_size)
    if world_size == 1 or (replica <= budget and not mixed_precision):
        name = "replicate" if not mixed_precision else "grad_op"
    elif zero2 <= budget:
        name = "grad_op"
    else:
        name = "full"
    why = (f"auto: replica state {replica / 2**20:.1f} MiB, sharded {zero2 / 2**20:.1f} MiB; a quarter of the rank's "
           f"memory {budget / 2**20:.0f} MiB")
    return SHARDINGS[name](), why


def rank_memory(device: torch.device, world_size: int) -> int:
    """Bytes of memory one rank may count on: its GPU's, or on CPU the machine's shared among the ranks."""
    import os

    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")) // max(1, world_size)


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
