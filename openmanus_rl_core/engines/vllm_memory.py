"""The KV-cache budget of a :class:`~openmanus_rl_core.engines.vllm.VLLMEngine`: how much of its device one
worker's vLLM may take, and the vLLM arguments that say so.

The KV cache is sized from this worker's share of its device, divided among the workers that share it,
and printed at start (``engine.memory`` holds the numbers):

- GPU: vLLM gets ``gpu_memory_utilization x gpu_share`` of the GPU, where ``gpu_share`` is the GPU fraction Ray
  gave this worker (``trainer.worker_num_gpus``: 1/2 when a critic shares the GPU; 1 outside Ray).
- CPU: ``kv_cache_bytes = min(gpu_memory_utilization x available memory x cpu_share, need)``, passed to vLLM as
  ``kv_cache_memory_bytes`` (what ``VLLM_CPU_KVCACHE_SPACE`` sets). ``cpu_share`` = this worker's Ray CPUs / its
  node's CPUs (1 / ``LOCAL_WORLD_SIZE`` under torchrun; 1 alone). ``need`` = ``max_num_seqs x max_model_len x
  2 x layers x kv_heads x head_dim x dtype bytes``: more than that can never be used, and the CPU backend zero-fills
  (commits) the whole cache at start.
- ``kv_cache_gib`` sets the KV cache explicitly (both devices); an exported ``VLLM_CPU_KVCACHE_SPACE`` (GiB) is
  respected on the CPU when ``kv_cache_gib`` is not given.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

__all__ = ["GiB", "memory_budget", "engine_arg_exists", "vllm_batch_defaults"]

log = logging.getLogger(__name__)

GiB = 1 << 30


def engine_arg_exists(name: str) -> bool:
    """Whether this vLLM's ``EngineArgs`` has the argument ``name`` (older versions lack some)."""
    import dataclasses

    from vllm.engine.arg_utils import EngineArgs

    return any(f.name == name for f in dataclasses.fields(EngineArgs))


def _ray_share(resource: str) -> float | None:
    """This Ray worker's share of its node's ``resource`` ("CPU" / "GPU" count); None outside a Ray worker."""
    try:
        import ray
    except ImportError:  # pragma: no cover - ray is a core dependency
        return None
    if not ray.is_initialized():
        return None
    ctx = ray.get_runtime_context()
    mine = float(ctx.get_assigned_resources().get(resource, 0.0))
    if mine <= 0:
        return None
    if resource == "GPU":  # per GPU: a worker holding whole GPUs has all of each
        return min(1.0, mine)
    node = next((n for n in ray.nodes() if n.get("NodeID") == ctx.get_node_id()), None)
    total = float((node or {}).get("Resources", {}).get(resource, 0.0))
    return min(1.0, mine / total) if total > 0 else None


def _kv_bytes_per_token(hf_config: Any, dtype: Any) -> int | None:
    """``2 x layers x kv_heads x head_dim x dtype bytes`` (K and V of one token); None when the config lacks them."""
    cfg = getattr(hf_config, "text_config", None) or hf_config
    layers = getattr(cfg, "num_hidden_layers", None)
    heads = getattr(cfg, "num_attention_heads", None)
    kv_heads = getattr(cfg, "num_key_value_heads", None) or heads
    head_dim = getattr(cfg, "head_dim", None) or (cfg.hidden_size // heads if heads else None)
    if not (layers and kv_heads and head_dim):
        return None
    if not isinstance(dtype, torch.dtype):
        name = str(getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None) or "float32")
        dtype = dtype if dtype not in (None, "auto") else name
        dtype = getattr(torch, str(dtype).replace("torch.", ""), torch.float32)
    return 2 * int(layers) * int(kv_heads) * int(head_dim) * torch.empty(0, dtype=dtype).element_size()


def vllm_batch_defaults() -> tuple[int, int] | None:
    """vLLM's own ``(max_num_batched_tokens, max_num_seqs)`` for the offline ``LLM`` on this platform."""
    try:
        from vllm.engine.arg_utils import EngineArgs
        from vllm.usage.usage_lib import UsageContext

        tokens, seqs = EngineArgs.get_batch_defaults(world_size=1)
        return int(tokens[UsageContext.LLM_CLASS]), int(seqs[UsageContext.LLM_CLASS])
    except Exception as exc:  # pragma: no cover - a vLLM without this classmethod
        log.debug("vLLM batch defaults unavailable: %s", exc)
        return None


def memory_budget(platform, fraction: float, kv_cache_gib: float | None, hf_config: Any, dtype: Any,
                  max_model_len: int | None, max_num_seqs: int | None) -> dict[str, Any]:
    """The KV-cache budget of this worker (see the module docstring) and the vLLM arguments for it.

    Returns ``{"device", "share", "kv_cache_bytes" (None: vLLM sizes it from gpu_memory_utilization),
    "gpu_memory_utilization", "vllm_kwargs", "report"}``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"VLLMEngine: gpu_memory_utilization={fraction} must be in (0, 1]")
    if kv_cache_gib is not None and not float(kv_cache_gib) > 0:
        raise ValueError(f"VLLMEngine: kv_cache_gib={kv_cache_gib} must be > 0 GiB (or null: derived)")
    on_cpu = bool(platform.is_cpu())
    out: dict[str, Any] = {"device": "cpu" if on_cpu else "gpu", "kv_cache_bytes": None}
    env_space = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "")
    if kv_cache_gib is not None:
        source = "kv_cache_gib"
        out["kv_cache_bytes"] = int(float(kv_cache_gib) * GiB)
    elif on_cpu and env_space.strip():
        source = "VLLM_CPU_KVCACHE_SPACE"
        out["kv_cache_bytes"] = int(float(env_space) * GiB)
    if on_cpu:
        share = _ray_share("CPU")
        if share is None:
            share = 1.0 / max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
        out["share"] = share
        out["gpu_memory_utilization"] = fraction
        if out["kv_cache_bytes"] is None:
            import psutil

            available = int(psutil.virtual_memory().available)
            budget = int(fraction * available * share)
            per_token = _kv_bytes_per_token(hf_config, dtype)
            need = per_token * max_model_len * max_num_seqs if per_token and max_model_len and max_num_seqs \
                else None
            out["kv_cache_bytes"] = min(budget, need) if need else budget
            capped = f", capped at {max_num_seqs} seqs x {max_model_len} tokens" if need and need < budget else ""
            source = f"{fraction} x {available / GiB:.1f} GiB available x share {share:.3g}{capped}"
        report = f"CPU KV cache {out['kv_cache_bytes'] / GiB:.3f} GiB ({source})"
    else:
        share = _ray_share("GPU") or 1.0
        out["share"] = share
        out["gpu_memory_utilization"] = fraction * share
        report = (f"GPU memory for vLLM {out['gpu_memory_utilization']:.3g} of the GPU (gpu_memory_utilization "
                  f"{fraction} x this worker's GPU share {share:.3g})")
        if out["kv_cache_bytes"] is not None:
            report += f", KV cache {out['kv_cache_bytes'] / GiB:.3f} GiB ({source})"
    out["vllm_kwargs"] = {"gpu_memory_utilization": out["gpu_memory_utilization"]}
    if out["kv_cache_bytes"] is not None:
        if engine_arg_exists("kv_cache_memory_bytes"):
            out["vllm_kwargs"]["kv_cache_memory_bytes"] = out["kv_cache_bytes"]
        elif on_cpu:  # older vLLM: the CPU backend reads whole GiB from the environment only
            os.environ["VLLM_CPU_KVCACHE_SPACE"] = str(max(1, round(out["kv_cache_bytes"] / GiB)))
    out["report"] = report
    return out
