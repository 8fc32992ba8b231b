"""The policy worker: FSDP2-sharded model, reference policy, rollout engine, log-probs, updates, weight sync."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import threading
import time
from typing import Any, Mapping

import torch

from openmanus_rl_core.algorithms.schedules import make_lr_lambda, make_optimizer
from openmanus_rl_core.batch import Batch
from openmanus_rl_core.distributed.fsdp import choose_sharding, gather_full_state, load_full_state
from openmanus_rl_core.workers.base import Worker
from openmanus_rl_core.workers.logprobs import sequence_logprobs
from openmanus_rl_core.workers.rng import capture_worker_rng, restore_worker_rng, saved_generator


class ActorWorker(Worker):
    """One rank of the policy group (see the module docstring).

    ``model_dir``: a Hugging Face folder (model + tokenizer) every rank loads, so all ranks start from the very
    same weights. ``total_steps`` sizes the LR schedule.
    """

    role = "actor"

    # ------------------------------------------------------------------------------------------------ set-up
    def setup(self, master_addr: str, master_port: int) -> dict:
        from transformers import AutoModelForCausalLM

        from openmanus_rl_core.models.loading import (
            _dtype,
            apply_lora,
            load_tokenizer,
            transposed_modules,
            lora_scaling,
        )

        self.setup_distributed(master_addr, master_port)
        cfg = self.cfg
        self.tokenizer = load_tokenizer(self.model_dir, cfg.model.chat_template)
        model = AutoModelForCausalLM.from_pretrained(self.model_dir, local_files_only=True,
                                                     dtype=_dtype(cfg.model.dtype))
        if cfg.model.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        # The rollout engine's unsharded copy (FSDP2 shards in place, so copy first). With LoRA the engine holds
        # the plain model and receives merged weights (base + scaled B @ A): no adapter branches at generation.
        engine_model = copy.deepcopy(model).eval()
        self.transposed = transposed_modules(engine_model)  # GPT-2's Conv1D keeps its weights transposed
        model = apply_lora(model, cfg.model.lora)
        model.train()
        self.lora = cfg.model.lora.enabled
        self.lora_scaling = lora_scaling(cfg.model.lora) if self.lora else None
        for p in engine_model.parameters():
            p.requires_grad_(False)
        # The rollout engine by name (registry "engine"; hf by default), over the unsharded copy.
        from openmanus_rl_core.plugin.registry import build

        self.engine = build("engine", {"name": cfg.rollout.engine, "kwargs": cfg.rollout.engine_kwargs},
                            model=engine_model, tokenizer=self.tokenizer, device=self.device,
                            seed=cfg.seed * 1000 + self.rank)
        # The reference policy, only when a KL term needs it: the policy RL starts from (these weights; after a
        # warm-up, the warmed-up ones: end_warmup; on resume, the checkpoint's: load_state). With a teacher
        # (algorithm.teacher.path, on-policy distillation) it is the teacher, and stays the teacher.
        from openmanus_rl_core.algorithms.kl import uses_reference

        self.use_ref, self.teacher = uses_reference(cfg.algorithm), cfg.algorithm.teacher.path
        self.ref = None
        mp = cfg.trainer.mixed_precision
        self.sharding, why = choose_sharding(cfg.actor.sharding, model, self.device, self.world_size, mp)
        if self.use_ref:
            ref = copy.deepcopy(model).eval() if not self.teacher else AutoModelForCausalLM.from_pretrained(
                self.teacher, local_files_only=True, dtype=_dtype(cfg.model.dtype)).eval()
            for p in ref.parameters():
                p.requires_grad_(False)
            self.ref = self.sharding.wrap(ref.to(self.device), mp)
        self.model = self.sharding.wrap(model.to(self.device), mp)
        self.optim_cfg = cfg.actor
        # Gradient checkpointing turns the KV cache off, which the shared-prompt forward runs on. Unset: on a CPU
        # only (on a GPU its arbitrary attention mask cost more than the shared tokens saved: bench/gpu_actor.py).
        share = self.device.type == "cpu" if cfg.actor.share_prompts is None else cfg.actor.share_prompts
        self.share_prompts = share and not cfg.model.gradient_checkpointing
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer, self.scheduler = make_optimizer(params, self.optim_cfg, self.total_steps)
        self.temperature = cfg.rollout.temperature
        # The engine's weights change only under this lock: a streaming rollout's generate calls hold it, so new
        # weights land between two turns. policy_version: optimizer steps behind the engine's weights.
        self.engine_lock = threading.RLock()
        self.policy_version = 0
        self.stream = None
        self._env_factory = None
        self._template = None
        self.warm_optimizer = None
        n_params = sum(p.numel() for p in self.model.parameters())
        return {"rank": self.rank, "device": str(self.device), "params": int(n_params),
                "trainable": int(sum(p.numel() for p in params)), "sharding": f"{self.sharding.name} ({why})"}

    def _agent_parts(self):
        """Template and env factory, built once per worker from the registries."""
        if self._template is None:
            from openmanus_rl_core.plugin.registry import build

            self._template = build("template", self.cfg.template)
            self._env_factory = lambda: build("env", self.cfg.env)
            self._memory = build("memory", self.cfg.memory)  # #15: what context each reply sees
        return self._template, self._env_factory

    # ---------------------------------------------------------------------------------------------- rollout
    def rollout(self, tasks: list[dict], overrides: Mapping[str, Any] | None = None, keep_rng: bool = False) -> list:
        """Run the agent loop over ``tasks`` (this rank's share) and return its episodes, in task order.

        ``overrides``: rollout config values for this call (validation passes ``temperature`` / ``greedy``).
        ``keep_rng``: leave the sampling generator's state as it was (validation must not shift the training
        samples, so a resumed run samples the same as an uninterrupted one).
        """
        from openmanus_rl_core.rollout import AgentLoop
        from openmanus_rl_core.process.stopping import Abandoned, cancelled_call

        template, env_factory = self._agent_parts()
        rcfg = dataclasses.replace(self.cfg.rollout, **dict(overrides or {}))
        agent = self.cfg.agent.command or self.cfg.agent.function
        if agent:  # your own agent, behind the gateway
            loop = self._agent_rollout(template).sampling(rcfg)
        else:
            loop = AgentLoop(self.engine, self.tokenizer, template, env_factory, rcfg, memory=self._memory)
            loop.version = self.policy_version  # the engine's weights: recorded on every token they generate
        loop.abandon = cancelled_call()  # the driver cancels this call when the run stops (process/stopping.py)
        rng = capture_worker_rng(self._generators())
        # The loop generates in this thread: a running stream's generation waits (validation, eval). An agent's
        # calls are generated by the gateway's batcher thread, which takes the lock around each generate itself.
        with contextlib.nullcontext() if agent else self.engine_lock:
            try:
                if keep_rng:
                    with saved_generator(self.engine.generator):
                        return loop.run(tasks)
                return loop.run(tasks)
            except Abandoned:  # given up: the RNGs as before it, so a resumed run plays it as an uninterrupted one
                restore_worker_rng(rng, self._generators())
                return []
            finally:
                # Colocated on one device: hand the engine's memory to training until the next generate / weight
                # push (never while a stream generates with it).
                if self.cfg.rollout.sleep_after_rollout and hasattr(self.engine, "sleep") and self.stream is None:
                    self.engine.sleep()

    def _agent_rollout(self, template: Any):
        """The gateway over this rank's engine and the agents' runner (gateway/rollout.py), started once."""
        if getattr(self, "_agents", None) is None:
            from openmanus_rl_core.gateway.rollout import AgentRollout

            self._agents = AgentRollout(self.engine, self.tokenizer, template, self.cfg.agent,
                                        lambda: self.policy_version, self.cfg.rollout.gen_wait_ms / 1000.0,
                                        lock=self.engine_lock)
        return self._agents

    def score_continuations(self, prompts: list, continuations: list) -> list[float] | None:
        """Each continuation's summed token log-probability after its prompt under the rollout engine's copy of the
        policy (the weights validation plays with); None when the engine holds no model here (a served one)."""
        from openmanus_rl_core.models.scoring import continuation_logprobs

        model = getattr(self.engine, "model", None)
        if not isinstance(model, torch.nn.Module):  # vLLM or a served model: no module here to run
            return None
        with self.engine_lock:
            if hasattr(self.engine, "wake_up"):  # a sleeping engine's weights wait in CPU memory
                self.engine.wake_up()
            try:
                return continuation_logprobs(model, prompts, continuations, self.tokenizer.pad_token_id)
            finally:
                if self.cfg.rollout.sleep_after_rollout and hasattr(self.engine, "sleep") and self.stream is None:
                    self.engine.sleep()

    # ------------------------------------------------------------------------------------------ the stream
    def stream_start(self) -> None:
        """Start this rank's side of the group stream (rollout/stream.py)."""
        from openmanus_rl_core.rollout import AgentLoop
        from openmanus_rl_core.rollout.stream import RankStream

        template, env_factory = self._agent_parts()
        loop = AgentLoop(self.engine, self.tokenizer, template, env_factory, self.cfg.rollout, memory=self._memory)
        runner = None
        if self.cfg.agent.command or self.cfg.agent.function:  # your own agent, behind the gateway
            from openmanus_rl_core.gateway.rollout import AgentStream

            runner = AgentStream(self._agent_rollout(template), self.cfg.rollout)
        self.stream = RankStream(loop, self.engine_lock, lambda: self.policy_version, runner=runner)

    def stream_submit(self, groups: list) -> None:
        self.stream.submit(groups)

    def stream_take(self, max_wait_s: float) -> dict:
        return self.stream.take(max_wait_s)

    def stream_stop(self) -> None:
        if self.stream is not None:
            self.stream.stop()
            self.stream = None

    # ------------------------------------------------------------------------------------------- log-probs
    @torch.no_grad()
    def compute_log_probs(self, batch: Batch, with_ref: bool = True, with_old: bool = True) -> dict[str, torch.Tensor]:
        """``old_log_probs`` (current policy) and ``ref_log_probs`` (reference policy) ``[B, R]`` for this rank's
        rows, in their order and layout (0 in padding columns), micro-batched by ``actor.log_prob_micro_batch_size``
        rows and ``actor.log_prob_max_tokens_per_micro_batch`` tokens."""
        out: dict[str, torch.Tensor] = {}
        batch = batch.to(self.device)
        limits = (self.optim_cfg.log_prob_micro_batch_size, self.optim_cfg.log_prob_max_tokens_per_micro_batch)
        pack, share = self.optim_cfg.pack_rows, self.share_prompts
        if with_old:
            self.model.eval()
            out["old_log_probs"] = self._forward_rows(
                batch, lambda mb: sequence_logprobs(self.model, mb, self.temperature, pack=pack,
                                                    share_prompts=share)[0], *limits).cpu()
            self.model.train()
            self.sharding.after_step(self.model)
        if with_ref and self.ref is not None:
            choices = bool(self.cfg.algorithm.choice_kl_coeff) and "choice_ids" in batch
            ref = self._forward_rows(
                batch, lambda mb: sequence_logprobs(self.ref, mb, self.temperature, pack=pack, share_prompts=share,
                                                    with_choices=choices), *limits)
            out["ref_log_probs"] = ref[0].cpu()
            if choices:
                out["ref_choice_log_probs"] = ref[2].cpu()
        return out

    # ---------------------------------------------------------------------------------------------- update
    def update(self, batch: Batch, step: int) -> dict[str, float]:
        """PPO-style policy update over this rank's rows; returns metrics averaged over mini-batches.

        Batch needs ``input_ids, attention_mask, position_ids, responses, response_mask, advantages``, with the
        rollout correction on (algorithms/correction.py) ``rollout_log_probs``, and either ``old_log_probs`` or
        nothing (then the update is on-policy with one mini-batch and one epoch, and the old
        log-probs are the detached current ones). With ``use_kl_loss`` also ``ref_log_probs``.

        Per mini-batch: ``loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl + choice_kl_coeff *
        choice_kl + all_action_coeff * all_action`` (the KL coefficient on ``algorithm.kl_loss_schedule``;
        ``choice_kl`` where the batch has ``ref_choice_log_probs``: :func:`~openmanus_rl_core.algorithms.kl.choice_kl`;
        ``all_action`` where it has ``choice_values``:
        :func:`~openmanus_rl_core.algorithms.losses.all_action_loss`); gradients are clipped to
        ``actor.grad_clip``; a non-finite loss or gradient norm (on any rank) skips the optimizer step. At a step
        that is a multiple of ``algorithm.ref_reset_steps`` the updated policy then becomes the reference.
        """
        metrics = self._update_loop(batch, step, self._policy_loss(), "actor/loss")
        every = self.cfg.algorithm.ref_reset_steps
        if every is not None and step % every == 0:
            self.reset_reference()
        return metrics

    def accumulate(self, batch: Batch) -> float:
        """``rollout.overlap_update``: the policy gradient of one chunk of the step's batch (keys as :meth:`update`),
        added to the gradients so far; :meth:`step_accumulated` ends the update. Returns the chunk's response
        tokens on this rank."""
        return self._accumulate(batch, self._policy_loss())

    def step_accumulated(self, total_tokens: float) -> dict[str, float]:
        """The optimizer step after :meth:`accumulate`'s chunks: the update :meth:`update` makes on their rows
        together (``total_tokens``: the batch's response tokens, all ranks); its metrics."""
        return self._step_accumulated(total_tokens, "actor/loss")

    def _policy_loss(self):
        """``part_loss(micro_batch) -> (loss, stats)``: the policy loss of :meth:`update` on one micro-batch."""
        from openmanus_rl_core.algorithms import agg_loss, all_action_loss, choice_kl, kl_penalty
        from openmanus_rl_core.algorithms.correction import correction_mode, truncated_is_weights
        from openmanus_rl_core.plugin.registry import registry

        algo = self.cfg.algorithm
        loss_fn = registry("loss").get(algo.policy_loss)
        loss_cfg = dict(algo.loss_cfg)
        agg_mode = loss_cfg["agg_mode"]
        use_kl_loss = algo.use_kl_loss and self.ref is not None
        # the schedule's factor at this update (the LR scheduler counts the updates made, across a resume too)
        kl_coef = algo.kl_loss_coef * make_lr_lambda(algo.kl_loss_schedule, self.total_steps)(self.scheduler.last_epoch)
        correct = correction_mode(algo, self.cfg.rollout, self.cfg.agent) == "tis"

        def part_loss(part: Batch) -> tuple[torch.Tensor, dict[str, float]]:
            logp, entropy, choice_logp = sequence_logprobs(self.model, part, self.temperature, with_entropy=True,
                                                           pack=self.optim_cfg.pack_rows,
                                                           share_prompts=self.share_prompts,
                                                           with_choices="ref_choice_log_probs" in part
                                                           or "choice_values" in part)
            mask = part["response_mask"]
            old = part["old_log_probs"] if "old_log_probs" in part else logp.detach()
            adv, corr = part["advantages"], {}
            if correct:  # decoupled PPO: old is the proximal policy, the engine's log-probs the behaviour one
                w, corr = truncated_is_weights(old, part["rollout_log_probs"], mask, algo.tis_cap)
                adv = adv * w
            pg_loss, pg_metrics = loss_fn(old, logp, adv, mask, **loss_cfg)
            ent = agg_loss(entropy, mask, agg_mode)
            loss = pg_loss - algo.entropy_coeff * ent if algo.entropy_coeff else pg_loss
            stats = {"actor/pg_loss": float(pg_metrics.get("pg_loss", float(pg_loss.detach()))),
                     "actor/entropy": float(ent.detach()),
                     "actor/pg_clipfrac": float(pg_metrics.get("clipfrac", 0.0)),
                     "actor/ppo_kl": float(pg_metrics.get("approx_kl", 0.0)), **corr}
            if use_kl_loss:
                kl = agg_loss(kl_penalty(logp, part["ref_log_probs"], algo.kl_loss_type), mask, agg_mode)
                loss = loss + kl_coef * kl
                stats["actor/kl_loss"] = float(kl.detach())
                stats["actor/kl_loss_coef"] = kl_coef
            if "ref_choice_log_probs" in part:
                ckl = agg_loss(choice_kl(choice_logp, part["ref_choice_log_probs"], part["choice_ids"]), mask,
                               agg_mode)
                loss = loss + algo.choice_kl_coeff * ckl
                stats["actor/choice_kl"] = float(ckl.detach())
            if "choice_values" in part:
                every, gap = all_action_loss(choice_logp, part["choice_values"], part["choice_ids"])
                loss = loss + algo.all_action_coeff * agg_loss(every, mask, agg_mode)
                stats["actor/choice_value_gap"] = float(agg_loss(gap, mask, agg_mode))
            return loss, stats

        return part_loss

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
        """RL starts from here: the warm-up's optimizer goes, and the reference policy becomes the warmed-up one
        (a KL term then holds RL near what the demonstrations taught, not near the untrained model)."""
        self.warm_optimizer = None
        self.reset_reference()

    def reset_reference(self) -> None:
        """The reference policy becomes the current one (``algorithm.ref_reset_steps``; a teacher stays)."""
        if self.ref is not None and not self.teacher:
            with torch.no_grad():
                for r, p in zip(self.ref.parameters(), self.model.parameters(), strict=True):
                    r.copy_(p)

    # -------------------------------------------------------------------------------------- weight sync
    def sync_rollout_weights(self, version: int | None = None) -> float:
        """Push the trained weights into this rank's rollout engine (in memory); returns seconds taken.
        ``version``: the policy version they are (optimizer steps completed), recorded on the tokens they generate.

        A sharded model: gathers the full state dict on rank 0 (CPU), merges LoRA adapters into their base weights
        when LoRA is on, broadcasts each tensor over the CPU group, then every rank loads it into its engine.
        Replicas (``actor.sharding=replicate``) hold the same whole weights after every step: each rank loads its
        own, with no collective.
        """
        t0 = time.perf_counter()
        if self.sharding.whole_on_every_rank:
            sd = self._engine_weights(self.model.state_dict())
        else:
            sd = self._gathered_engine_weights()
        with self.engine_lock:
            self.engine.update_weights(sd)
            if version is not None:
                self.policy_version = int(version)
        return time.perf_counter() - t0

    def _gathered_engine_weights(self) -> dict:
        """The engine's weights of a sharded model, on every rank: gathered on rank 0, then broadcast."""
        import torch.distributed as dist

        sd = gather_full_state(self.model, self.rank)
        if self.rank == 0:
            sd = self._engine_weights(sd)  # with LoRA, merge before the broadcast: fewer, plain tensors
        if self.world_size == 1:
            return sd
        meta = [[(k, tuple(v.shape), str(v.dtype).replace("torch.", "")) for k, v in sd.items()]] if self.rank == 0 \
            else [None]
        dist.broadcast_object_list(meta, src=0, group=self.cpu_group)
        if self.rank != 0:
            sd = {k: torch.empty(shape, dtype=getattr(torch, dt)) for k, shape, dt in meta[0]}
        for k in [m[0] for m in meta[0]]:
            t = sd[k].contiguous()
            dist.broadcast(t, src=0, group=self.cpu_group)
            sd[k] = t
        return sd

    # ----------------------------------------------------------------------------------------- checkpoint
    def _generators(self) -> dict[str, torch.Generator]:
        return {"engine": self.engine.generator}  # the sampler: a resumed run draws the same samples

    def _weights_loaded(self, model_sd: Mapping) -> None:
        self.engine.update_weights(self._engine_weights(model_sd))

    def get_state(self) -> dict:
        """As :meth:`Worker.get_state`, with the reference policy (``ref_model``) when a KL term uses one (not a
        teacher's)."""
        state = super().get_state()
        if self.ref is not None and not self.teacher:  # a teacher is read from its folder again
            ref_sd = gather_full_state(self.ref, self.rank, copy=True)
            if self.rank == 0:
                state["ref_model"] = ref_sd
        return state

    def load_state(self, model_sd: Mapping, optim_sd: Mapping | None = None, scheduler_sd: Mapping | None = None,
                   rng: Mapping | None = None, ref_sd: Mapping | None = None) -> None:
        """As :meth:`Worker.load_state`; the reference policy (when a KL term uses one) gets ``ref_sd``, or, from a
        checkpoint saved without one, the checkpoint's policy: RL goes on from there."""
        super().load_state(model_sd, optim_sd, scheduler_sd, rng)
        if self.ref is not None and not self.teacher:
            load_full_state(self.ref, ref_sd if ref_sd is not None else model_sd)

    def get_model_state(self) -> dict | None:
        """The full model state dict on rank 0 (None elsewhere). A collective."""
        return gather_full_state(self.model, self.rank, copy=True)

    def _engine_weights(self, model_sd: Mapping) -> dict:
        """The training model's full state dict as the rollout engine loads it (LoRA adapters merged)."""
        from openmanus_rl_core.models.loading import merge_lora_state

        return merge_lora_state(model_sd, self.lora_scaling, self.transposed) if self.lora else dict(model_sd)


