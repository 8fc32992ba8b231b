"""The critic worker: value model (backbone plus a linear head) for PPO with GAE."""

from __future__ import annotations

from typing import Any

import torch

from openmanus_rl_core.algorithms.schedules import make_optimizer
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.distributed.fsdp import choose_sharding
from openmanus_rl_core.workers.base import Worker
from openmanus_rl_core.workers.microbatch import on_trimmed


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
    """Values aligned with the response tokens: position ``P + t - 1`` scores token ``t`` (as log-probs do).
    Computed without the batch's all-padding columns; 0 in those."""

    def values(small: Batch) -> torch.Tensor:
        R = small["responses"].shape[1]
        v = model(input_ids=small["input_ids"], attention_mask=small["attention_mask"],
                  position_ids=small["position_ids"])
        return v[:, -R - 1:-1].float()

    return on_trimmed(values, batch)


class CriticWorker(Worker):
    """One rank of the critic group (PPO with GAE): value model, optimizer, LR schedule."""

    role = "critic"

    def setup(self, master_addr: str, master_port: int) -> dict:
        from transformers import AutoConfig, AutoModel

        from openmanus_rl_core.models.loading import _dtype

        self.setup_distributed(master_addr, master_port)
        dtype = _dtype(self.cfg.model.dtype)
        config = AutoConfig.from_pretrained(self.model_dir, local_files_only=True)
        backbone = AutoModel.from_pretrained(self.model_dir, local_files_only=True, dtype=dtype)
        hidden = int(getattr(config, "hidden_size", 0) or getattr(config, "n_embd"))
        model = ValueModel(backbone, hidden).to(dtype)
        model.train()
        mp = self.cfg.trainer.mixed_precision
        self.sharding, why = choose_sharding(self.cfg.critic.sharding, model, self.device, self.world_size, mp)
        self.model = self.sharding.wrap(model.to(self.device), mp)
        self.optim_cfg = self.cfg.critic
        self.optimizer, self.scheduler = make_optimizer(list(self.model.parameters()), self.optim_cfg,
                                                         self.total_steps)
        return {"rank": self.rank, "device": str(self.device),
                "params": int(sum(p.numel() for p in self.model.parameters())),
                "sharding": f"{self.sharding.name} ({why})"}

    @torch.no_grad()
    def compute_values(self, batch: Batch) -> torch.Tensor:
        """Values ``[B, R]`` for this rank's rows (0 where ``response_mask`` is 0), micro-batched by
        ``critic.micro_batch_size`` rows and ``critic.max_tokens_per_micro_batch`` tokens."""
        self.model.eval()
        batch = batch.to(self.device)
        values = self._forward_rows(batch, lambda mb: _value_positions(self.model, mb), self.optim_cfg.micro_batch_size,
                                    self.optim_cfg.max_tokens_per_micro_batch)
        self.model.train()
        self.sharding.after_step(self.model)
        return (values * batch["response_mask"].to(values.dtype)).cpu()

    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """Clipped value regression on ``returns`` (needs ``values`` = the old values, ``returns``,
        ``response_mask``), mini-batches over ``critic.ppo_epochs``, gradient clipping, NaN skipping."""
        from openmanus_rl_core.algorithms import value_loss

        clip, agg_mode = self.optim_cfg.value_clip, self.cfg.algorithm.loss_cfg["agg_mode"]

        def part_loss(part: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            vpred = _value_positions(self.model, part)
            loss, m = value_loss(vpred, part["values"], part["returns"], part["response_mask"], clip=clip,
                                 agg_mode=agg_mode)
            return loss, {"critic/vf_clipfrac": m.get("vf_clipfrac", 0.0), "critic/vpred_mean": m.get("vpred_mean", 0.0)}

        return self._update_loop(batch, step, part_loss, "critic/vf_loss", stream=(1,))



