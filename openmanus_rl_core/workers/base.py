"""One rank of a worker group: process group, device, seeding, the shared update loop, and checkpoint state."""

from __future__ import annotations

import math
import os
import random
import sys
from typing import Any, Callable, Mapping

import numpy as np
import torch

from openmanus_rl_core.batch import Batch
from openmanus_rl_core.distributed.fsdp import (
    gather_full_state,
    gather_optim_state,
    load_full_state,
)
from openmanus_rl_core.distributed.ray_node import (
    is_loopback,
    local_store_path,
    loopback_interface,
)
from openmanus_rl_core.config.schema import Config
from openmanus_rl_core.workers.microbatch import plan_micro_batches, row_extents, token_share
from openmanus_rl_core.workers.rng import capture_worker_rng, restore_worker_rng

GIL_SWITCH_INTERVAL_S = 0.0005  # see Worker.__init__


def _finite(x: float) -> bool:
    return math.isfinite(float(x))


class Worker:
    """One rank of a worker group: process group set-up, device choice, threads, seeding, the update loop that
    actor and critic share, and checkpoint state."""

    role = "worker"

    def __init__(self, cfg: Config, rank: int, world_size: int, model_dir: str, total_steps: int):
        self.cfg = cfg  # the typed config, once: calls carry data only
        self.rank = int(rank)
        self.world_size = int(world_size)
        self.model_dir = str(model_dir)  # a Hugging Face folder every rank loads: all ranks start from the same weights
        self.total_steps = int(total_steps)  # sizes the LR schedule
        self._accumulated: dict | None = None  # an overlapped update's chunks so far (rollout.overlap_update)
        torch.set_num_threads(cfg.trainer.torch_threads)
        # A worker runs several Python threads: env calls, and in the group stream generation beside training. A
        # small model's forward is thousands of short torch ops, each releasing the GIL; with Python's default 5 ms
        # switch interval a thread waits up to 5 ms to take it back after every op (measured with bench/async.py:
        # the stream at eta=2 ran at 0.68x lockstep's samples/s with 5 ms, 1.5x with 0.5 ms).
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)
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

    def freeze_heap(self) -> int:
        """Hide the objects alive after set-up from the garbage collector (process/heap.py); returns how many. The
        worker's process lives as long as the run, so they are never given back."""
        from openmanus_rl_core.process import heap

        return heap.freeze()

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
            from openmanus_rl_core.models.loading import avoid_cudnn_attention

            torch.cuda.set_device(self.device)
            avoid_cudnn_attention(self.device)  # the update meets a new sequence shape every micro-batch
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
        self.sharding.sync_grads(self.model)
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
        self.sharding.after_step(self.model)
        return norm, stepped

    def _micro_index(self, batch: Batch, max_rows: int | None, max_tokens: int | None) -> list[list[int]]:
        """Row indices of ``batch``'s micro-batches (:func:`plan_micro_batches`). Under a token budget the ranks
        agree on the count (the largest any rank needs): a sharded model's forward passes are collectives."""
        prompt, resp = row_extents(batch)
        index = plan_micro_batches(prompt, resp, max_tokens, max_rows)
        if max_tokens and self.world_size > 1 and not self.sharding.whole_on_every_rank:
            import torch.distributed as dist

            k = torch.tensor([len(index)], device=self.device)
            dist.all_reduce(k, op=dist.ReduceOp.MAX)
            if int(k.item()) > len(index):
                index = plan_micro_batches(prompt, resp, max_tokens, max_rows, num_parts=int(k.item()))
        return index

    def _update_loop(self, batch: Batch, step: int, part_loss: Callable[[Batch], tuple[torch.Tensor, dict]],
                     loss_key: str, stream: tuple[int, ...] = ()) -> dict[str, float]:
        """The update both roles share: ``optim_cfg.ppo_epochs`` passes over ``batch`` in mini-batches of
        ``optim_cfg.ppo_mini_batch_size`` rows (split among the ranks), each mini-batch accumulated over
        micro-batches (``optim_cfg.micro_batch_size`` rows, or by the token budget
        ``optim_cfg.max_tokens_per_micro_batch`` with rows bucketed by length), then one clipped optimizer step.

        ``part_loss(micro_batch) -> (loss, stats)`` gives a micro-batch's token-mean loss. Micro-batches are weighted
        by their share of the mini-batch's response tokens, so the accumulated gradient (and each stat) equals the
        unsplit mini-batch's. The step's loss is reported as ``loss_key``; ``stream`` keeps the roles' shuffles apart.
        """
        ocfg = self.optim_cfg
        mini = None if ocfg.ppo_mini_batch_size is None else max(1, ocfg.ppo_mini_batch_size // self.world_size)
        batch = batch.to(self.device)
        self.model.train()
        per_update: list[dict[str, float]] = []  # one stats dict per optimizer step (mini-batch)
        skipped = 0
        for _, mb in _minibatches(batch, mini, ocfg.ppo_epochs, ocfg.shuffle, (self.seed, int(step), self.rank, *stream)):
            self.optimizer.zero_grad(set_to_none=True)
            stats: dict[str, float] = {}
            total = self._backward_parts(mb, part_loss, stats)
            grad_norm, stepped = self._clip_and_step(self.optimizer, total, ocfg.grad_clip)
            skipped += not stepped
            stats[loss_key] = total
            stats[f"{self.role}/grad_norm"] = grad_norm
            per_update.append(stats)
        return self._finish_updates(self.role, per_update, skipped)

    def _backward_parts(self, mb: Batch, part_loss: Callable[[Batch], tuple[torch.Tensor, dict]],
                        stats: dict[str, float], weight: Callable[[Batch], float] | None = None) -> float:
        """Backward of ``mb`` in micro-batches; gradients add up in ``.grad``, weighted stats in ``stats``. Returns
        the weighted loss. ``weight(part)`` multiplies each part's loss; None: its share of ``mb``'s response tokens
        (1 when unsplit), so the sum is ``mb``'s token-mean loss, and only the last part syncs a grad_op sharding's
        gradients. With a ``weight``, every part syncs (the caller may not step after ``mb``)."""
        ocfg = self.optim_cfg
        index = self._micro_index(mb, ocfg.micro_batch_size, ocfg.max_tokens_per_micro_batch)
        mb_tokens = float(mb["response_mask"].sum().clamp_min(1))
        total = 0.0
        for i, rows in enumerate(index):
            part = mb[rows] if len(index) > 1 else mb
            self.sharding.before_backward(self.model, last=weight is not None or i == len(index) - 1)
            loss, part_stats = part_loss(part)
            if weight is not None:
                w = weight(part)
            else:
                w = token_share(part, mb_tokens) if len(index) > 1 else 1.0
            (loss * w).backward()
            total += float(loss.detach()) * w
            for k, v in part_stats.items():
                stats[k] = stats.get(k, 0.0) + float(v) * w
        return total

    # ------------------------------------------------------------------------------------ overlapped update
    def _accumulate(self, batch: Batch, part_loss: Callable[[Batch], tuple[torch.Tensor, dict]]) -> float:
        """One chunk of a step's batch (``rollout.overlap_update``): each micro-batch's token-mean loss times its
        response tokens, so ``.grad`` holds the SUM over the chunk's tokens; :meth:`_step_accumulated` divides
        by the batch's tokens and steps. Returns the chunk's response tokens on this rank."""
        batch = batch.to(self.device)
        self.model.train()
        if self._accumulated is None:
            self.optimizer.zero_grad(set_to_none=True)
            self._accumulated = {"tokens": 0.0, "loss": 0.0, "stats": {}}
        acc = self._accumulated
        acc["loss"] += self._backward_parts(batch, part_loss, acc["stats"],
                                            weight=lambda part: float(part["response_mask"].sum()))
        tokens = float(batch["response_mask"].sum())
        acc["tokens"] += tokens
        return tokens

    def _step_accumulated(self, total_tokens: float, loss_key: str) -> dict[str, float]:
        """The optimizer step after the chunks: gradients divided by ``total_tokens`` (the whole batch's response
        tokens, all ranks) times the world size (the ranks' gradients are averaged), so the update is the
        batch's token-mean loss however the rows were chunked and spread. Stats: this rank's token means."""
        acc, self._accumulated = self._accumulated, None
        if acc is None:
            raise RuntimeError("an overlapped update's step came before any of its chunks")
        scale = self.world_size / max(float(total_tokens), 1.0)
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.mul_(scale)
        mine = max(acc["tokens"], 1.0)
        stats = {k: v / mine for k, v in acc["stats"].items()}
        stats[loss_key] = acc["loss"] / mine
        grad_norm, stepped = self._clip_and_step(self.optimizer, stats[loss_key], self.optim_cfg.grad_clip)
        stats[f"{self.role}/grad_norm"] = grad_norm
        return self._finish_updates(self.role, [stats], int(not stepped))

    def _forward_rows(self, batch: Batch, fn: Callable[[Batch], Any], max_rows: int | None,
                      max_tokens: int | None) -> Any:
        """``fn`` (per-row results: a tensor, or a tuple of tensors and Nones) over ``batch`` in micro-batches,
        results in the original row order."""
        from openmanus_rl_core.workers.microbatch import restore_rows

        index = self._micro_index(batch, max_rows, max_tokens)
        if len(index) == 1:
            return fn(batch)
        parts = [fn(batch[rows]) for rows in index]
        if not isinstance(parts[0], tuple):
            return restore_rows(parts, index)
        return tuple(None if part[0] is None else restore_rows(list(part), index) for part in zip(*parts))

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
        model_sd = gather_full_state(self.model, self.rank, copy=True)
        optim_sd = gather_optim_state(self.model, self.optimizer, self.rank)
        state = {"rank": self.rank, "rng": capture_worker_rng(self._generators())}
        if self.rank == 0:
            state.update({"model": model_sd, "optimizer": optim_sd, "scheduler": self.scheduler.state_dict()})
        return state

    def load_state(self, model_sd: Mapping, optim_sd: Mapping | None = None, scheduler_sd: Mapping | None = None,
                   rng: Mapping | None = None) -> None:
        """Load full model (and optimizer, scheduler, RNG) state. A collective.

        The learning rate stays this run's setting: the checkpoint gives the optimizer's moments and the point of the
        schedule, not the peak rate, so a resume that changes ``actor.lr`` (announced as a change) trains at it."""
        peak = [g["initial_lr"] for g in self.optimizer.param_groups]
        load_full_state(self.model, model_sd, self.optimizer if optim_sd is not None else None, optim_sd)
        if scheduler_sd is not None:
            self.scheduler.load_state_dict(dict(scheduler_sd))
        self.scheduler.base_lrs = peak
        for group, lr, factor in zip(self.optimizer.param_groups, peak, self.scheduler.lr_lambdas):
            group["initial_lr"], group["lr"] = lr, lr * factor(self.scheduler.last_epoch)
        if rng is not None:
            restore_worker_rng(rng, self._generators())
        self._weights_loaded(model_sd)

    def shutdown(self) -> None:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


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
