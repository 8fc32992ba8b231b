"""Worker groups: Ray actors that hold FSDP2-sharded models.

Two kinds of worker, each a plain class that the driver wraps with ``ray.remote``:

- :class:`ActorWorker` -- the policy. Holds the trainable model sharded with ``fully_shard`` (FSDP2), its
  optimizer and learning-rate schedule, a frozen reference policy when KL is on, and its own rollout engine
  (:class:`~openmanus_rl_core.engines.hf.HFEngine`) over an *unsharded* copy of the model. After each update the
  full state dict is gathered (``get_model_state_dict(full_state_dict=True, cpu_offload=True)``: rank 0 receives
  it), broadcast to the other ranks over a CPU (gloo) group, and loaded into every rank's engine in memory.
  Each rank runs the agent loop over its own share of the tasks with its own envs.
- :class:`CriticWorker` -- the value model for PPO/GAE: the backbone of the same causal LM plus a linear value
  head, FSDP2-sharded, with its own optimizer.

``N`` workers of a group form one ``torch.distributed`` process group (gloo on CPU, NCCL on GPU); the driver picks
``MASTER_ADDR``/``MASTER_PORT`` and the ranks. Every method that touches the sharded model is a collective: the
driver calls it on every rank of the group with equally sized shards of the batch.

Token layout of a training batch (what :func:`openmanus_rl_core.rollout.build_batch` produces), ``P`` prompt and
``R`` response positions::

    input_ids      [B, P + R]   prompt (left-padded) followed by the response (right-padded)
    attention_mask [B, P + R]
    position_ids   [B, P + R]
    responses      [B, R]       response token ids (agent and observation tokens of a multi-turn episode)
    response_mask  [B, R]       1 on agent tokens (the ones trained), 0 on observations and padding

The log-probability of response token ``t`` is read from the logits at position ``P + t - 1``:
``logp[b, t] = log_softmax(logits[b, P + t - 1] / T)[responses[b, t]]`` with ``T`` the rollout temperature.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import random
import time
from contextlib import contextmanager
from typing import Any, Mapping, Sequence

import numpy as np
import torch

from openmanus_rl_core.batch import Batch
from openmanus_rl_core.schema import Config, OptimConfig
from openmanus_rl_core.ray_node import is_loopback, local_store_path, loopback_interface

__all__ = [
    "WorkerGroup",
    "ActorWorker",
    "CriticWorker",
    "ValueModel",
    "make_lr_lambda",
    "sequence_logprobs",
    "apply_fsdp",
    "capture_worker_rng",
    "restore_worker_rng",
]


# ------------------------------------------------------------------------------------------------ helpers


def make_lr_lambda(schedule: str, total_steps: int, warmup_steps: int = 0, min_lr_ratio: float = 0.0):
    """The LR multiplier per scheduler step ``s`` (one scheduler step per training step).

    - warm-up (``s < warmup_steps``): ``(s + 1) / warmup_steps``
    - ``constant``: 1
    - ``cosine``: ``min_lr_ratio + (1 - min_lr_ratio) * 0.5 * (1 + cos(pi * p))``,
      ``p = (s - warmup_steps) / max(1, total_steps - warmup_steps)`` clamped to [0, 1]
    - ``linear``: ``min_lr_ratio + (1 - min_lr_ratio) * (1 - p)``
    """
    schedules = {
        "constant": lambda p: 1.0,
        "cosine": lambda p: min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * p)),
        "linear": lambda p: min_lr_ratio + (1.0 - min_lr_ratio) * (1.0 - p),
    }
    if schedule not in schedules:
        raise ValueError(f"unknown lr schedule {schedule!r}; choose one of {sorted(schedules)}")
    shape = schedules[schedule]
    warmup_steps = max(0, int(warmup_steps))
    total_steps = max(1, int(total_steps))

    def lr_lambda(s: int) -> float:
        if s < warmup_steps:
            return float(s + 1) / float(warmup_steps)
        p = min(1.0, max(0.0, (s - warmup_steps) / max(1, total_steps - warmup_steps)))
        return float(shape(p))

    return lr_lambda


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


def sequence_logprobs(
    model: torch.nn.Module,
    batch: Batch,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens under ``model`` (see the module docstring for the layout).

    Returns ``logp [B, R]`` and, when ``with_entropy``, the entropy of ``softmax(logits / T)`` per response
    position ``[B, R]`` (else None). Only the last ``R + 1`` positions' logits are materialised.
    """
    from openmanus_rl_core.algorithms import entropy_from_logits

    responses = batch["responses"]
    R = responses.shape[1]
    out = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
        logits_to_keep=R + 1,
    )
    logits = out.logits[:, -R - 1:-1, :].float()
    if temperature and temperature > 0 and temperature != 1.0:
        logits = logits / float(temperature)
    logp_all = torch.log_softmax(logits, dim=-1)
    logp = logp_all.gather(-1, responses.unsqueeze(-1)).squeeze(-1)
    entropy = entropy_from_logits(logits) if with_entropy else None
    return logp, entropy


def _masked_mean(x: torch.Tensor, mask: torch.Tensor) -> float:
    m = mask.to(x.dtype)
    return float((x * m).sum() / m.sum().clamp_min(1.0))


def capture_worker_rng(extra_generators: Mapping[str, torch.Generator] | None = None) -> dict:
    """This process's RNG states (python, numpy, torch; see :func:`checkpoint.capture_rng_state`) plus the states
    of named ``torch.Generator`` objects (e.g. the rollout engine's sampler). weights_only-safe."""
    from openmanus_rl_core.checkpoint import capture_rng_state

    return {"process": capture_rng_state(),
            "generators": {k: g.get_state() for k, g in (extra_generators or {}).items()}}


def restore_worker_rng(state: Mapping, extra_generators: Mapping[str, torch.Generator] | None = None) -> None:
    """Undo :func:`capture_worker_rng`."""
    from openmanus_rl_core.checkpoint import restore_rng_state

    restore_rng_state(dict(state["process"]))
    for k, g in (extra_generators or {}).items():
        if k in state.get("generators", {}):
            g.set_state(state["generators"][k])


def _finite(x: float) -> bool:
    return math.isfinite(float(x))


# ---------------------------------------------------------------------------------------------- base worker
class _DistributedWorker:
    """One rank of a worker group: process group set-up, device choice, threads, seeding."""

    role = "worker"

    def __init__(self, cfg: Config, rank: int, world_size: int, model_dir: str, total_steps: int):
        self.cfg = cfg  # the typed config, once: calls carry data only
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.model_dir = str(model_dir)  # a Hugging Face folder every rank loads: all ranks start from the same weights
        self.total_steps = int(total_steps)  # sizes the LR schedule
        torch.set_num_threads(cfg.trainer.torch_threads)
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        try:  # weight-loading progress bars of every worker would flood the driver's console
            from transformers.utils import logging as hf_logging

            hf_logging.set_verbosity_error()
            hf_logging.disable_progress_bar()
        except Exception:
            pass

    def free_address(self) -> tuple[str, int]:
        """An address of this node and a free TCP port on it: rank 0's answer becomes MASTER_ADDR/PORT."""
        import socket

        try:
            import ray

            host = ray.util.get_node_ip_address()
        except Exception:  # not under Ray (tests)
            host = "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("", 0))
            port = int(s.getsockname()[1])
        if is_loopback(host):
            local_store_path(port).unlink(missing_ok=True)  # a killed run's file for the same port would mislead
        return host, port

    # Ray runs the constructor asynchronously; set-up (which blocks until every rank joined) is a separate call
    # so that its errors surface at the driver's ray.get.
    def setup_distributed(self, master_addr: str, master_port: int) -> None:
        import torch.distributed as dist

        self.master_addr, self.master_port = str(master_addr), int(master_port)

        torch.set_num_threads(self.cfg.trainer.torch_threads)
        os.environ.update({"MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
                           "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": "0"})
        want = self.cfg.trainer.device
        use_cuda = torch.cuda.is_available() and want in ("auto", "cuda")
        if want == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("trainer.device=cuda but this worker sees no CUDA device; use trainer.device=cpu")
        self.device = torch.device("cuda", 0) if use_cuda else torch.device("cpu")
        if use_cuda:
            torch.cuda.set_device(self.device)
        backend = "nccl" if use_cuda else "gloo"
        if not dist.is_initialized():
            if is_loopback(self.master_addr):  # a local run: nothing of the group may listen on the network
                rendezvous = {"store": dist.FileStore(str(local_store_path(self.master_port)), self.world_size)}
                for var in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
                    os.environ.setdefault(var, loopback_interface() or "lo")
            else:
                rendezvous = {"init_method": f"tcp://{self.master_addr}:{self.master_port}"}
            dist.init_process_group(backend, rank=self.rank, world_size=self.world_size, **rendezvous)
        # Broadcasting the gathered (CPU) state dict needs a CPU-capable group also when the main one is NCCL.
        self.cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else dist.group.WORLD
        seed = self.seed = self.cfg.seed
        self._seed_process(seed * 1000 + 17 * self.rank + (0 if self.role == "actor" else 7))

    @staticmethod
    def _seed_process(seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % (2 ** 32))
        torch.manual_seed(seed)

    def ping(self) -> dict:
        return {"rank": self.rank, "pid": os.getpid(), "device": str(self.device), "threads": torch.get_num_threads()}

    def _all_ranks_agree_finite(self, *values: float) -> bool:
        """True when every value is finite on every rank (one all-reduce of a flag)."""
        import torch.distributed as dist

        bad = torch.tensor([0.0 if all(_finite(v) for v in values) else 1.0], device=self.device)
        dist.all_reduce(bad, op=dist.ReduceOp.MAX)
        return float(bad.item()) == 0.0

    def _clip_and_step(self, optimizer, loss: float, max_norm: float) -> tuple[float, bool]:
        """Clip the gradients to ``max_norm`` (none when <= 0), then step ``optimizer`` only if the loss and the
        gradient norm are finite on every rank; gradients are cleared either way. Returns ``(grad_norm, stepped)``.
        """
        params = [p for p in self.model.parameters() if p.grad is not None]
        if not params:
            norm = 0.0
        else:
            if max_norm and max_norm > 0:
                total = torch.nn.utils.clip_grad_norm_(params, max_norm)
            else:
                total = torch.nn.utils.get_total_norm([p.grad for p in params])
            norm = float(total.full_tensor() if hasattr(total, "full_tensor") else total)  # a DTensor under FSDP2
        stepped = self._all_ranks_agree_finite(loss, norm)
        if stepped:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return norm, stepped

    def _finish_updates(self, role: str, per_update: list[dict[str, float]], skipped: int) -> dict[str, float]:
        """End of one ``update`` call: advance the LR schedule; each stat averaged over the optimizer steps (a stat
        missing from a step counts as 0), plus ``<role>/lr``, ``<role>/skipped_updates``, ``<role>/num_updates``."""
        self.scheduler.step()
        sums: dict[str, float] = {}
        for stats in per_update:
            for k, v in stats.items():
                sums[k] = sums.get(k, 0.0) + v
        metrics = {k: v / max(1, len(per_update)) for k, v in sums.items()}
        metrics[f"{role}/lr"] = float(self.optimizer.param_groups[0]["lr"])
        metrics[f"{role}/skipped_updates"] = float(skipped)
        metrics[f"{role}/num_updates"] = float(len(per_update))
        return metrics

    # ----------------------------------------------------------------------------------------- checkpoint
    def _generators(self) -> dict[str, torch.Generator]:
        """Named ``torch.Generator`` objects saved with the process RNG states (none by default)."""
        return {}

    def _weights_loaded(self, model_sd: Mapping) -> None:
        """Called by :meth:`load_state` after the model got ``model_sd`` (the actor refreshes its engine)."""

    def get_state(self) -> dict:
        """Model/optimizer/scheduler (full, on rank 0; None elsewhere) and this rank's RNG states. A collective."""
        model_sd = self._gather_full_state(self.model, copy=True)
        optim_sd = self._gather_optim_state(self.model, self.optimizer)
        state = {"rank": self.rank, "rng": capture_worker_rng(self._generators())}
        if self.rank == 0:
            state.update({"model": model_sd, "optimizer": optim_sd, "scheduler": self.scheduler.state_dict()})
        return state

    def load_state(self, model_sd: Mapping, optim_sd: Mapping | None = None, scheduler_sd: Mapping | None = None,
                   rng: Mapping | None = None) -> None:
        """Load full model (and optimizer, scheduler, RNG) state. A collective."""
        self._load_full_state(self.model, model_sd, self.optimizer if optim_sd is not None else None, optim_sd)
        if scheduler_sd is not None:
            self.scheduler.load_state_dict(dict(scheduler_sd))
        if rng is not None:
            restore_worker_rng(rng, self._generators())
        self._weights_loaded(model_sd)

    def _gather_full_state(self, model, copy: bool = False) -> dict | None:
        """Full model state dict on rank 0 (CPU); None on the other ranks. A collective.

        ``copy``: detach the result from the live parameters (with one rank and a CPU model the gathered tensors
        can share storage with them, and the next optimizer step would change a saved state).
        """
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return None
        return _detached(sd) if copy else sd

    def _gather_optim_state(self, model, optimizer) -> dict | None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        osd = get_optimizer_state_dict(model, optimizer,
                                       options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _detached(osd) if self.rank == 0 else None

    def _load_full_state(self, model, model_sd: Mapping, optimizer=None, optim_sd: Mapping | None = None) -> None:
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        opts = StateDictOptions(full_state_dict=True)
        set_model_state_dict(model, dict(model_sd), options=opts)
        if optimizer is not None and optim_sd is not None:
            set_optimizer_state_dict(model, optimizer, dict(optim_sd), options=opts)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def _make_optimizer(params, ocfg: OptimConfig, total_steps: int):
    optimizer = torch.optim.AdamW(params, lr=ocfg.lr, betas=tuple(ocfg.betas), eps=ocfg.eps,
                                  weight_decay=ocfg.weight_decay)
    lr_lambda = make_lr_lambda(ocfg.lr_schedule, total_steps, ocfg.lr_warmup_steps, ocfg.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)
    return optimizer, scheduler


def _minibatches(batch: Batch, mini_size: int | None, epochs: int, shuffle: bool, seed: tuple[int, ...]):
    """``(epoch, mini-batch)`` pairs: ``epochs`` passes over ``batch`` in mini-batches of ``mini_size`` rows.

    The shuffle is a fixed function of ``seed`` (no global RNG is consumed, so a resumed run shuffles the same).
    """
    n = len(batch)
    size = n if not mini_size or mini_size >= n else int(mini_size)
    for epoch in range(epochs):
        if shuffle and size < n:
            perm = np.random.default_rng([*seed, epoch]).permutation(n)
            rows = batch[perm.tolist()]
        else:
            rows = batch
        for mb in rows.split(size):
            yield epoch, mb


def _micro(batch: Batch, micro_size: int | None) -> list[Batch]:
    return batch.split(int(micro_size)) if micro_size and micro_size < len(batch) else [batch]


# --------------------------------------------------------------------------------------------- actor worker
class ActorWorker(_DistributedWorker):
    """One rank of the policy group (see the module docstring).

    ``model_dir``: a Hugging Face folder (model + tokenizer) every rank loads, so all ranks start from the very
    same weights. ``total_steps`` sizes the LR schedule.
    """

    role = "actor"

    # ------------------------------------------------------------------------------------------------ set-up
    def setup(self, master_addr: str, master_port: int) -> dict:
        from transformers import AutoModelForCausalLM

        from openmanus_rl_core.models import _dtype, apply_lora, load_tokenizer, lora_scaling

        self.setup_distributed(master_addr, master_port)
        cfg = self.cfg
        self.tokenizer = load_tokenizer(self.model_dir)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, local_files_only=True,
                                                     dtype=_dtype(cfg.model.dtype))
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # The rollout engine's unsharded copy (FSDP2 shards in place, so copy first). With LoRA the engine holds
        # the plain model and receives merged weights (base + scaled B @ A): no adapter branches at generation.
        engine_model = copy.deepcopy(model).eval()
        model = apply_lora(model, cfg.model.lora)
        model.train()
        self.lora = cfg.model.lora.enabled
        self.lora_scaling = lora_scaling(cfg.model.lora) if self.lora else None
        for p in engine_model.parameters():
            p.requires_grad_(False)
        # The rollout engine by name (registry "engine"; hf by default), over the unsharded copy.
        from openmanus_rl_core.registry import build

        self.engine = build("engine", {"name": cfg.rollout.engine, "kwargs": cfg.rollout.engine_kwargs},
                            model=engine_model, tokenizer=self.tokenizer, device=self.device,
                            seed=cfg.seed * 1000 + self.rank)
        # The reference policy (frozen initial weights), only when a KL term needs it.
        self.use_ref = cfg.algorithm.use_kl_in_reward or cfg.algorithm.use_kl_loss
        self.ref = None
        if self.use_ref:
            ref = copy.deepcopy(model).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref = apply_fsdp(ref.to(self.device), cfg.trainer.mixed_precision)
        self.model = apply_fsdp(model.to(self.device), cfg.trainer.mixed_precision)
        self.optim_cfg = cfg.actor
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = _make_optimizer(params, self.optim_cfg, self.total_steps)
        self.temperature = cfg.rollout.temperature
        self._env_factory = None
        self._template = None
        self.warm_optimizer = None
        n_params = sum(p.numel() for p in self.model.parameters())
        return {"rank": self.rank, "device": str(self.device), "params": int(n_params),
                "trainable": int(sum(p.numel() for p in params))}

    def _agent_parts(self):
        """Template and env factory, built once per worker from the registries."""
        if self._template is None:
            from openmanus_rl_core.registry import build

            self._template = build("template", self.cfg.template)
            self._env_factory = lambda: build("env", self.cfg.env)
        return self._template, self._env_factory

    # ---------------------------------------------------------------------------------------------- rollout
    def rollout(self, tasks: list[dict], overrides: Mapping[str, Any] | None = None, keep_rng: bool = False) -> list:
        """Run the agent loop over ``tasks`` (this rank's share) and return its episodes, in task order.

        ``overrides``: rollout config values for this call (validation passes ``temperature`` / ``greedy``).
        ``keep_rng``: leave the sampling generator's state as it was (validation must not shift the training
        samples, so a resumed run samples the same as an uninterrupted one).
        """
        from openmanus_rl_core.rollout import AgentLoop

        template, env_factory = self._agent_parts()
        rcfg = dataclasses.replace(self.cfg.rollout, **dict(overrides or {}))
        loop = AgentLoop(self.engine, self.tokenizer, template, env_factory, rcfg)
        try:
            if keep_rng:
                with _saved_generator(self.engine.generator):
                    return loop.run(tasks)
            return loop.run(tasks)
        finally:
            # Colocated on one device: hand the engine's memory to training until the next generate / weight push.
            if self.cfg.rollout.sleep_after_rollout and hasattr(self.engine, "sleep"):
                self.engine.sleep()

    # ------------------------------------------------------------------------------------------- log-probs
    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, with_ref: bool = True, with_old: bool = True) -> dict[str, torch.Tensor]:
        """``old_log_probs`` (current policy) and ``ref_log_probs`` (reference policy) for this rank's rows,
        ``actor.log_prob_micro_batch_size`` rows per forward pass."""
        out: dict[str, torch.Tensor] = {}
        parts = _micro(batch.to(self.device), self.optim_cfg.log_prob_micro_batch_size)
        if with_old:
            self.model.eval()
            out["old_log_probs"] = torch.cat([sequence_logprobs(self.model, mb, self.temperature)[0]
                                              for mb in parts]).cpu()
            self.model.train()
        if with_ref and self.ref is not None:
            out["ref_log_probs"] = torch.cat([sequence_logprobs(self.ref, mb, self.temperature)[0]
                                              for mb in parts]).cpu()
        return out

    # ---------------------------------------------------------------------------------------------- update
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """PPO-style policy update over this rank's rows; returns metrics averaged over mini-batches.

        Batch needs ``input_ids, attention_mask, position_ids, responses, response_mask, advantages`` and either
        ``old_log_probs`` or nothing (then the update is on-policy with one mini-batch and one epoch, and the old
        log-probs are the detached current ones). With ``use_kl_loss`` also ``ref_log_probs``.

        Per mini-batch: ``loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl``; gradients are clipped to
        ``actor.grad_clip``; a non-finite loss or gradient norm (on any rank) skips the optimizer step.
        """
        from openmanus_rl_core.algorithms import agg_loss, kl_penalty
        from openmanus_rl_core.registry import registry

        algo, ocfg = self.cfg.algorithm, self.optim_cfg
        loss_fn = registry("loss").get(algo.policy_loss)
        loss_cfg = dict(algo.loss_cfg)
        agg_mode = loss_cfg["agg_mode"]
        ent_coef = algo.entropy_coeff
        use_kl_loss = algo.use_kl_loss and self.ref is not None
        mini = None if ocfg.ppo_mini_batch_size is None else max(1, ocfg.ppo_mini_batch_size // self.world_size)

        batch = batch.to(self.device)
        self.model.train()
        per_update: list[dict[str, float]] = []  # one stats dict per optimizer step (mini-batch)
        skipped = 0
        for epoch, mb in _minibatches(batch, mini, ocfg.ppo_epochs, ocfg.shuffle, (self.seed, int(step), self.rank)):
            self.optimizer.zero_grad(set_to_none=True)
            parts = _micro(mb, ocfg.micro_batch_size)
            mb_tokens = float(mb["response_mask"].sum().clamp_min(1))
            stats: dict[str, float] = {}
            loss_total = 0.0
            for part in parts:
                logp, entropy = sequence_logprobs(self.model, part, self.temperature, with_entropy=True)
                mask = part["response_mask"]
                old = part["old_log_probs"] if "old_log_probs" in part else logp.detach()
                pg_loss, pg_metrics = loss_fn(old, logp, part["advantages"], mask, **loss_cfg)
                loss = pg_loss
                ent = agg_loss(entropy, mask, agg_mode)
                if ent_coef:
                    loss = loss - ent_coef * ent
                if use_kl_loss:
                    kl = agg_loss(kl_penalty(logp, part["ref_log_probs"], algo.kl_loss_type), mask, agg_mode)
                    loss = loss + algo.kl_loss_coef * kl
                    _acc(stats, "actor/kl_loss", float(kl.detach()))
                # Micro-batches weighted by their share of the mini-batch's tokens: the sum equals the
                # mini-batch's token-mean loss.
                weight = float(mask.sum()) / mb_tokens if len(parts) > 1 else 1.0
                (loss * weight).backward()
                loss_total += float(loss.detach()) * weight
                _acc(stats, "actor/pg_loss", float(pg_metrics.get("pg_loss", float(pg_loss.detach()))) * weight)
                _acc(stats, "actor/entropy", float(ent.detach()) * weight)
                _acc(stats, "actor/pg_clipfrac", float(pg_metrics.get("clipfrac", 0.0)) * weight)
                _acc(stats, "actor/ppo_kl", float(pg_metrics.get("approx_kl", 0.0)) * weight)
            grad_norm, stepped = self._clip_and_step(self.optimizer, loss_total, ocfg.grad_clip)
            skipped += not stepped
            stats["actor/loss"] = loss_total
            stats["actor/grad_norm"] = grad_norm
            per_update.append(stats)
        return self._finish_updates("actor", per_update, skipped)

    # ---------------------------------------------------------------------------------- supervised warm-up
    def sft_update(self, batch: Batch, lr: float, grad_clip: float) -> dict[str, float]:
        """One supervised step on demonstrations: token-mean cross-entropy over ``loss_mask``.

        Batch: ``input_ids, attention_mask, position_ids, loss_mask`` (all ``[B, L]``; ``loss_mask[b, t] = 1``
        where token ``t`` is a demonstrated agent token). A separate AdamW (created on the first call, dropped by
        :meth:`end_warmup`) so the RL optimizer's moments start clean.
        """
        if self.warm_optimizer is None:
            params = [p for p in self.model.parameters() if p.requires_grad]
            self.warm_optimizer = torch.optim.AdamW(params, lr=float(lr), weight_decay=0.0)
        for g in self.warm_optimizer.param_groups:
            g["lr"] = float(lr)
        batch = batch.to(self.device)
        self.model.train()
        self.warm_optimizer.zero_grad(set_to_none=True)
        ids = batch["input_ids"]
        out = self.model(input_ids=ids, attention_mask=batch["attention_mask"],
                         position_ids=batch["position_ids"], use_cache=False)
        logits = out.logits[:, :-1, :].float()
        targets = ids[:, 1:]
        mask = batch["loss_mask"][:, 1:].to(logits.dtype)
        nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                reduction="none").view_as(mask)
        loss = (nll * mask).sum() / mask.sum().clamp_min(1.0)
        loss.backward()
        grad_norm, ok = self._clip_and_step(self.warm_optimizer, float(loss.detach()), grad_clip)
        with torch.no_grad():
            acc = ((logits.argmax(-1) == targets).to(mask.dtype) * mask).sum() / mask.sum().clamp_min(1.0)
        return {"loss": float(loss.detach()), "grad_norm": grad_norm, "token_acc": float(acc), "skipped": float(not ok)}

    def end_warmup(self) -> None:
        self.warm_optimizer = None

    # -------------------------------------------------------------------------------------- weight sync
    def sync_rollout_weights(self) -> float:
        """Push the trained weights into this rank's rollout engine (in memory); returns seconds taken.

        Gathers the full state dict on rank 0 (CPU), merges LoRA adapters into their base weights when LoRA is on,
        broadcasts each tensor over the CPU group, then every rank loads it into its engine.
        """
        import torch.distributed as dist

        t0 = time.perf_counter()
        sd = self._gather_full_state(self.model)
        if self.rank == 0:
            sd = self._engine_weights(sd)  # with LoRA, merge before the broadcast: fewer, plain tensors
        meta = [[(k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in sd.items()]] if self.rank == 0 \
            else [None]
        if self.world_size > 1:
            dist.broadcast_object_list(meta, src=0, group=self.cpu_group)
            if self.rank != 0:
                sd = {k: torch.empty(shape, dtype=getattr(torch, dt)) for k, shape, dt in meta[0]}
            for k in [m[0] for m in meta[0]]:
                t = sd[k].contiguous()
                dist.broadcast(t, src=0, group=self.cpu_group)
                sd[k] = t
        self.engine.update_weights(sd)
        return time.perf_counter() - t0

    # ----------------------------------------------------------------------------------------- checkpoint
    def _generators(self) -> dict[str, torch.Generator]:
        return {"engine": self.engine.generator}  # the sampler: a resumed run draws the same samples

    def _weights_loaded(self, model_sd: Mapping) -> None:
        self.engine.update_weights(self._engine_weights(model_sd))

    def get_model_state(self) -> dict | None:
        """The full model state dict on rank 0 (None elsewhere). A collective."""
        return self._gather_full_state(self.model, copy=True)

    def _engine_weights(self, model_sd: Mapping) -> dict:
        """The training model's full state dict as the rollout engine loads it (LoRA adapters merged)."""
        from openmanus_rl_core.models import merge_lora_state

        return merge_lora_state(model_sd, self.lora_scaling) if self.lora else dict(model_sd)


# -------------------------------------------------------------------------------------------- critic worker
class ValueModel(torch.nn.Module):
    """A causal LM's backbone plus a linear value head: ``values[b, t] = head(h[b, t])``.

    ``_no_split_modules`` is forwarded from the backbone so FSDP shards its decoder layers.
    """

    def __init__(self, backbone: torch.nn.Module, hidden_size: int):
        super().__init__()
        self.backbone = backbone
        self.value_head = torch.nn.Linear(hidden_size, 1)
        # Zero init: the first values are 0 and the first GAE advantages are the plain returns.
        torch.nn.init.zeros_(self.value_head.weight)
        torch.nn.init.zeros_(self.value_head.bias)
        self._no_split_modules = list(getattr(backbone, "_no_split_modules", None) or [])

    def forward(self, input_ids, attention_mask=None, position_ids=None, **_: Any) -> torch.Tensor:
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            use_cache=False)
        h = out.last_hidden_state
        # A fresh tensor, not a view: FSDP2 hooks the root module's output for backward.
        return self.value_head(h.to(self.value_head.weight.dtype))[..., 0].clone()


def _value_positions(model: torch.nn.Module, batch: Batch) -> torch.Tensor:
    """Values aligned with the response tokens: position ``P + t - 1`` scores token ``t`` (as log-probs do)."""
    R = batch["responses"].shape[1]
    values = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                   position_ids=batch["position_ids"])
    return values[:, -R - 1:-1].float()


class CriticWorker(_DistributedWorker):
    """One rank of the critic group (PPO with GAE): value model, optimizer, LR schedule."""

    role = "critic"

    def setup(self, master_addr: str, master_port: int) -> dict:
        from transformers import AutoConfig, AutoModel

        from openmanus_rl_core.models import _dtype

        self.setup_distributed(master_addr, master_port)
        dtype = _dtype(self.cfg.model.dtype)
        config = AutoConfig.from_pretrained(self.model_dir, local_files_only=True)
        backbone = AutoModel.from_pretrained(self.model_dir, local_files_only=True, dtype=dtype)
        hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd"))
        model = ValueModel(backbone, hidden).to(dtype)
        model.train()
        self.model = apply_fsdp(model.to(self.device), self.cfg.trainer.mixed_precision)
        self.optim_cfg = self.cfg.critic
        self.optimizer, self.scheduler = _make_optimizer(list(self.model.parameters()), self.optim_cfg,
                                                         self.total_steps)
        return {"rank": self.rank, "device": str(self.device),
                "params": int(sum(p.numel() for p in self.model.parameters()))}

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values ``[B, R]`` for this rank's rows (0 where ``response_mask`` is 0), ``critic.micro_batch_size``
        rows per forward pass."""
        self.model.eval()
        batch = batch.to(self.device)
        values = torch.cat([_value_positions(self.model, mb)
                            for mb in _micro(batch, self.optim_cfg.micro_batch_size)])
        self.model.train()
        return (values * batch["response_mask"].to(values.dtype)).cpu()

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Clipped value regression on ``returns`` (needs ``values`` = the old values, ``returns``,
        ``response_mask``), mini-batches over ``critic.ppo_epochs``, gradient clipping, NaN skipping."""
        from openmanus_rl_core.algorithms import value_loss

        batch = batch.to(self.device)
        ocfg = self.optim_cfg
        clip = ocfg.value_clip
        agg_mode = self.cfg.algorithm.loss_cfg["agg_mode"]
        mini = None if ocfg.ppo_mini_batch_size is None else max(1, ocfg.ppo_mini_batch_size // self.world_size)
        per_update: list[dict[str, float]] = []
        skipped = 0
        self.model.train()
        for epoch, mb in _minibatches(batch, mini, ocfg.ppo_epochs, ocfg.shuffle, (self.seed, int(step), self.rank, 1)):
            self.optimizer.zero_grad(set_to_none=True)
            parts = _micro(mb, ocfg.micro_batch_size)
            mb_tokens = float(mb["response_mask"].sum().clamp_min(1))
            stats: dict[str, float] = {}
            total = 0.0
            for part in parts:
                vpred = _value_positions(self.model, part)
                loss, m = value_loss(vpred, part["values"], part["returns"], part["response_mask"],
                                     clip=clip, agg_mode=agg_mode)
                weight = float(part["response_mask"].sum()) / mb_tokens if len(parts) > 1 else 1.0
                (loss * weight).backward()
                total += float(loss.detach()) * weight
                _acc(stats, "critic/vf_clipfrac", m.get("vf_clipfrac", 0.0) * weight)
                _acc(stats, "critic/vpred_mean", m.get("vpred_mean", 0.0) * weight)
            gn, stepped = self._clip_and_step(self.optimizer, total, ocfg.grad_clip)
            skipped += not stepped
            stats["critic/vf_loss"] = total
            stats["critic/grad_norm"] = gn
            per_update.append(stats)
        return self._finish_updates("critic", per_update, skipped)



# ---------------------------------------------------------------------------------------------- utilities
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


def _acc(d: dict, key: str, value: float) -> None:
    d[key] = d.get(key, 0.0) + float(value)


@contextmanager
def _saved_generator(gen: torch.Generator):
    state = gen.get_state()
    try:
        yield
    finally:
        gen.set_state(state)


# ------------------------------------------------------------------------------------------------ groups
class WorkerGroupError(RuntimeError):
    """A rank of a worker group raised or died during ``method``; the group has been stopped."""

    def __init__(self, group: str, rank: int, method: str, cause: BaseException):
        self.group, self.rank, self.method, self.cause = group, rank, method, cause
        detail = str(cause).strip().splitlines()
        super().__init__(f"{group} rank {rank} failed in {method}: {type(cause).__name__}: "
                         f"{detail[-1] if detail else ''} (the {group} worker group was stopped; "
                         f"a restarted run resumes from the newest checkpoint with trainer.resume=auto)")


DEATH_GRACE_S = 5.0
"""How long a raised error waits for another rank's death to be reported (see :func:`_root_cause`)."""


def _root_cause(rank: int, error: Exception, pending: list, rank_of: Mapping) -> tuple[int, Exception]:
    """The failure to report, given the first one (``rank``, ``error``) and the calls still ``pending``.

    When a rank's process dies, its peers' collectives fail at once ("connection closed by peer"), often before
    Ray reports the death itself. So a raised error waits up to :data:`DEATH_GRACE_S` for a pending rank's death,
    and a death, the root cause, is reported instead of its peers' errors.
    """
    import ray

    deadline = time.monotonic() + DEATH_GRACE_S
    while pending and not isinstance(error, ray.exceptions.RayActorError):
        done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, deadline - time.monotonic()))
        if not done:
            break
        try:
            ray.get(done[0])
        except ray.exceptions.RayActorError as death:
            return rank_of[done[0]], death
        except Exception:  # another raised error: the first one stays the one reported
            pass
    return rank, error


class WorkerGroup:
    """``size`` Ray actors of one worker class forming one process group (ranks ``0..size-1``).

    Rank 0 names a free port on its node (MASTER_ADDR/PORT); every rank then joins the process group in
    :meth:`setup` (gloo on CPU, NCCL on GPU). ``call(method)`` runs a method on every rank and returns the results
    in rank order; ``call_each(method, per_rank_args)`` gives each rank its own arguments (its shard).

    A rank that raises or dies fails the call at once (a raise within :data:`DEATH_GRACE_S`): the other ranks may
    be blocked in a collective waiting for it, so the whole group is stopped and the error names the rank, the
    method and the original exception (instead of the driver hanging until the collective's own timeout). A rank
    whose process died is named rather than the peers whose collectives failed because of it.
    """

    def __init__(self, cls: type, size: int, cfg: Config, num_cpus: float = 1.0, num_gpus: float = 0.0,
                 name: str = "worker", placement_strategy: str = "SPREAD", **kwargs: Any):
        import ray

        from openmanus_rl_core.placement import worker_placement

        if int(size) < 1:
            raise ValueError(f"trainer.num_workers must be >= 1, got {size!r}")
        self.size = int(size)
        self.name = name
        self.workers = []
        # One placement-group bundle per rank: on a cluster SPREAD puts the ranks on different nodes.
        self.placement = worker_placement(self.size, num_cpus, num_gpus, strategy=placement_strategy,
                                          name=f"openmanus_rl_{name}")
        remote = ray.remote(cls)
        self.workers = [
            remote.options(**self.placement.options(rank)).remote(cfg, rank, self.size, **kwargs)
            for rank in range(self.size)
        ]
        try:
            addr, port = ray.get(self.workers[0].free_address.remote())
            self.setup_info = self._gather("setup", [w.setup.remote(addr, port) for w in self.workers])
        except Exception:
            self.kill()
            raise

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        return self._gather(method, [getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def call_each(self, method: str, per_rank_args: Sequence[tuple], **kwargs: Any) -> list:
        if len(per_rank_args) != self.size:
            raise ValueError(f"{self.name}.{method}: got {len(per_rank_args)} argument sets for {self.size} ranks")
        return self._gather(method, [getattr(w, method).remote(*a, **kwargs)
                                     for w, a in zip(self.workers, per_rank_args)])

    def _gather(self, method: str, refs: list) -> list:
        """The ranks' results in rank order, failing as soon as any rank fails (see the class docstring)."""
        import ray

        if not self.workers:
            raise RuntimeError(f"{self.name} worker group was stopped after an earlier failure; cannot call {method}")
        rank_of = {ref: rank for rank, ref in enumerate(refs)}
        pending = list(refs)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except Exception as e:
                rank, cause = _root_cause(rank_of[done[0]], e, pending, rank_of)
                self.kill()  # the others may wait in a collective for the failed rank forever
                raise WorkerGroupError(self.name, rank, method, cause) from cause
        return ray.get(refs)

    def kill(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.kill(w)
            except Exception:  # already gone
                pass
        self.workers = []
        self.placement.remove()
