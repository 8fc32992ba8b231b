"""Supervised warm-up on demonstrations (before RL): from the task data, or played by the env's oracle or by one of
its systematic demonstrators (``warmup.demonstrator``), all of them or the successes alone (``warmup.keep``).

A randomly initialised model almost never emits a well-formed action, so a pure RL run first has to discover the
action syntax by chance, and on a reward with partial credit it may find a way to game it instead (see
DESIGN.md, "Measured facts"). A few seconds of behaviour cloning on correct episodes fixes that. A task row's
``demonstration`` (``{"observation": first observation, "steps": [[action, next observation], ...]}``, e.g. read
from an OpenManus-RL conversation by :mod:`openmanus_rl_core.data.openmanus_layout`) is used as is; otherwise the env's
``oracle_action()`` (an :class:`~openmanus_rl_core.protocols.OracleEnv`) plays the task; an env without an oracle
and tasks without demonstrations give no demonstrations (the trainer then skips the warm-up with a notice). The
template renders each action as a reply, and the model is trained on those replies with the token layout the rollout uses
(:class:`~openmanus_rl_core.rollout.ChatDelta`), so what the model learns is exactly what it will be asked to
continue during RL.

Demonstration layout (one per task; ``loss_mask`` is 1 on reply tokens only)::

    input_ids = prompt(system, obs_0) | reply_0 | obs_delta_0 | reply_1 | ... | reply_k
    loss_mask =   0 ...                 1 ...     0 ...          1 ...          1 ...

``reply_t = encode(template.render(a_t))``, followed by the chat template's end-of-turn tokens when the template
has no stop strings (then the model must end its turn with EOS; with stop strings the engine stops there).
"""

from __future__ import annotations

import functools
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from openmanus_rl_core.batch import Batch
from openmanus_rl_core.plugin.envs import undelayed
from openmanus_rl_core.process.alive import Alive
from openmanus_rl_core.run.validation import validate

__all__ = ["oracle_episode", "demonstrator_policy", "play_episode", "model_demonstrations", "task_demonstration",
           "build_corpus", "build_demonstrations", "demo_batch", "run_warmup"]


def oracle_episode(env: Any, task: Mapping[str, Any], max_turns: int) -> tuple[str, list[tuple[str, str]]]:
    """Play ``task`` with the env's oracle. Returns ``(first observation, [(action, next observation), ...])``;
    the last pair is the one that ended the episode (or the ``max_turns``-th)."""
    return play_episode(env, task, max_turns, demonstrator_policy(env, "oracle"))[:2]


def demonstrator_policy(env: Any, name: str) -> Callable[[], str]:
    """The next-action function of the demonstrator ``name`` on ``env``: ``oracle`` is its ``oracle_action()``;
    any other name must be one of the systematic demonstrators the env offers (its ``demonstrators``, a mapping
    name -> description), played by its ``demonstrator_action(name)``."""
    offered = {"oracle": getattr(env, "oracle_action", None)}
    for systematic in getattr(env, "demonstrators", None) or {}:
        offered[systematic] = functools.partial(env.demonstrator_action, systematic)
    if name not in offered:
        from openmanus_rl_core.config import ConfigError

        raise ConfigError(f"warmup.demonstrator={name}: the env {type(env).__name__} offers {', '.join(offered)}")
    if offered[name] is None:
        raise TypeError(f"the env {type(env).__name__} has no oracle_action(); the supervised warm-up needs an "
                        "OracleEnv. Set warmup.steps=0 to train without it")
    return offered[name]


def play_episode(env: Any, task: Mapping[str, Any], max_turns: int,
                 act: Callable[[], str]) -> tuple[str, list[tuple[str, str]], float, bool]:
    """Play ``task`` with ``act`` (the next action in the env's current state): ``(first observation, [(action, next
    observation), ...], summed env reward, success)``, success as the last step's ``info["success"]`` says."""
    from openmanus_rl_core.rollout import start_task

    obs0 = start_task(env, task)
    steps: list[tuple[str, str]] = []
    reward, success = 0.0, False
    for _ in range(int(max_turns)):
        action = act()
        res = env.step(action)
        steps.append((action, res.observation))
        reward += float(res.reward)
        success = bool((res.info or {}).get("success", False))
        if res.done:
            break
    return obs0, steps, reward, success


def task_demonstration(task: Mapping[str, Any]) -> tuple[str, list[tuple[str, str]]] | None:
    """The task row's own demonstration as ``(first observation, [(action, next observation), ...])``, or None."""
    demo = task.get("demonstration")
    if not demo:
        return None
    return str(demo["observation"]), [(str(a), str(o)) for a, o in demo["steps"]]


def build_corpus(env_factory: Callable[[], Any], template: Any, tasks: Sequence[Mapping[str, Any]],
                 max_turns: int, log: Callable[[str], None] | None = None) -> list[str]:
    """Tokenizer training texts: each oracle episode's pieces (system prompt, observations, rendered replies;
    :func:`rollout.tokenizer_corpus`) plus the whole episode rendered in ChatML (:func:`chat_transcripts`), so
    merges span the chat scaffolding too. Two episodes per task, without a wrapper's simulated waits
    (:func:`envs.undelayed`); ``log`` hears how many are done at least every :data:`alive.EVERY_S` seconds."""
    from openmanus_rl_core.rollout import tokenizer_corpus

    env_factory = undelayed(env_factory)
    with Alive(log, "building the tokenizer corpus", total=2 * len(tasks), unit="episodes") as progress:
        texts = tokenizer_corpus(env_factory, template, tasks, max_turns=max_turns, progress=progress)
        return texts + chat_transcripts(env_factory, template, tasks, max_turns, progress)


def played_instruction(env: Any, default: str) -> str:
    """The instruction of the task ``env`` just played (a mix of envs has one per source), else ``default``."""
    return str(getattr(env, "instruction", "") or default) if env is not None else default


def chat_transcripts(env_factory: Callable[[], Any], template: Any, tasks: Sequence[Mapping[str, Any]],
                     max_turns: int, progress: Alive | None = None) -> list[str]:
    """Each task's demonstration (its own, or the env's oracle episode) rendered in ChatML: none for a task
    with neither. ``progress`` is told of each task."""
    from openmanus_rl_core.models.loading import IM_END, IM_START

    texts: list[str] = []
    probe = env_factory()
    try:
        instruction = str(getattr(probe, "instruction", "") or "")
        has_oracle = hasattr(probe, "oracle_action")
        no_oracle = set(getattr(probe, "without_oracle", None) or ())  # a mix's sources that have none
    finally:
        probe.close()
    for task in tasks:
        if progress is not None:
            progress.advance()
        episode = task_demonstration(task)
        if episode is None and (not has_oracle or task.get("source") in no_oracle):
            continue  # no env is built per task when nothing comes of it
        env = env_factory() if episode is None else None
        try:
            obs0, steps = episode if episode is not None else oracle_episode(env, task, max_turns)
            system = template.system_prompt(played_instruction(env, instruction))
            msgs = [("system", system), ("user", obs0)]
            for i, (action, obs) in enumerate(steps):
                msgs.append(("assistant", template.render(action)))
                if i < len(steps) - 1:
                    msgs.append(("user", obs))
            # Special tokens are split off by the tokenizer; only the text between them teaches merges.
            texts.append("".join(f"{IM_START}{r}\n{c}{IM_END}\n" for r, c in msgs))
        finally:
            if env is not None:
                env.close()
    return texts


def model_demonstrations(cfg: Any, env_factory: Callable[[], Any], template: Any,
                         tasks: Sequence[Mapping[str, Any]]) -> list[dict]:
    """``tasks``, each with the episode a model folder (``warmup.model_path``, e.g. a checkpoint exported with
    ``openmanus-rl export``, with its own tokenizer) plays greedily with the hf engine as its ``demonstration``
    (``{"observation", "steps", "reward", "success"}``): the ``model`` demonstrator, successes and failures alike.
    A task whose episode has no turn (an env error) gets none."""
    import dataclasses

    from transformers import AutoModelForCausalLM

    from openmanus_rl_core.models.loading import _dtype, load_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rollout import AgentLoop, expand_tasks

    path = cfg.warmup.model_path
    tok = load_tokenizer(path, cfg.model.chat_template)
    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=_dtype(cfg.model.dtype)).eval()
    engine = build("engine", {"name": "hf", "kwargs": {}}, model=model, tokenizer=tok, device="cpu", seed=cfg.seed)
    loop = AgentLoop(engine, tok, template, undelayed(env_factory), dataclasses.replace(cfg.rollout, n=1, greedy=True),
                     memory=build("memory", cfg.memory))
    episodes = loop.run(expand_tasks([dict(t, group_id=f"demo:{i}") for i, t in enumerate(tasks)], 1))
    out = []
    for task, episode in zip(tasks, episodes):  # the loop returns them in task order
        played = episode.trajectory
        steps = [(turn.action.content, turn.observation) for turn in played.turns]
        out.append(dict(task, demonstration={
            "observation": played.initial_observation, "steps": steps, "success": bool(played.success),
            "reward": float(sum(turn.reward for turn in played.turns))}) if steps else dict(task))
    return out


def build_demonstrations(env_factory: Callable[[], Any], template: Any, tokenizer: Any,
                         tasks: Sequence[Mapping[str, Any]], max_turns: int,
                         log: Callable[[str], None] | None = None, demonstrator: str = "oracle", keep: str = "all",
                         played: list[dict] | None = None) -> list[tuple[list[int], list[int]]]:
    """One ``(input_ids, loss_mask)`` per task that has a demonstration (its own, or one the ``demonstrator``
    plays: :func:`demonstrator_policy`), in the rollout's token layout (module docstring); with ``keep="success"``
    only the successful ones (filtered BC; a task's own demonstration counts as one unless it says
    ``"success": false``). Empty when the env has no such demonstrator and no task a demonstration. ``played``, if
    given, receives ``{"task_id", "reward", "success", "kept"}`` for every demonstration, kept or not. The
    demonstrator plays without a wrapper's simulated waits (:func:`envs.undelayed`); ``log`` hears how many tasks
    are done at least every :data:`alive.EVERY_S` seconds."""
    from openmanus_rl_core.rollout import ChatDelta

    env_factory = undelayed(env_factory)
    chat = ChatDelta(tokenizer)
    end_ids = [] if list(getattr(template, "stop", []) or []) else list(chat.end_ids)
    probe = env_factory()
    try:
        instruction = str(getattr(probe, "instruction", "") or "")
        can_play = demonstrator != "oracle" or hasattr(probe, "oracle_action")
        if demonstrator != "oracle":
            demonstrator_policy(probe, demonstrator)  # an unknown name fails before any task is played
        # A mix's sources without an oracle: their tasks are left out, as a single env without one is.
        no_oracle = list(getattr(probe, "without_oracle", None) or ()) if demonstrator == "oracle" and can_play else []
    finally:
        probe.close()
    if no_oracle and log is not None:
        left = sum(task.get("source") in no_oracle and task_demonstration(task) is None for task in tasks)
        log(f"warm-up: source{'s' if len(no_oracle) > 1 else ''} {', '.join(no_oracle)} of env=mix "
            f"{'have' if len(no_oracle) > 1 else 'has'} no oracle: {left} of the {len(tasks)} demonstration tasks "
            f"are left out of the warm-up (and of the tokenizer corpus's played episodes)")
    demos = []
    with Alive(log, "warm-up demonstrations", total=len(tasks), unit="tasks") as progress:
        for task in tasks:
            progress.advance()
            episode, shown = task_demonstration(task), probe
            if episode is not None:
                reward = float(task["demonstration"].get("reward", float("nan")))
                success = bool(task["demonstration"].get("success", True))
                prompt = _prompt(template, chat, shown, instruction)
            elif can_play and task.get("source") not in no_oracle:
                shown = env_factory()
                try:
                    *episode, reward, success = play_episode(shown, task, max_turns,
                                                             demonstrator_policy(shown, demonstrator))
                    prompt = _prompt(template, chat, shown, instruction)  # read before close: a mix forgets its env
                finally:
                    shown.close()
            if episode is None:
                continue
            kept = keep == "all" or success
            if played is not None:
                played.append({"task_id": task.get("task_id"), "reward": reward, "success": success, "kept": kept})
            if kept:
                demos.append(_demonstration(chat, template, *prompt, end_ids, *episode))
    return demos


def _prompt(template: Any, chat: Any, env: Any, instruction: str) -> tuple[str, list[dict] | None]:
    """``(system prompt, tools)`` as the rollout shows them for the task ``env`` played (rollout/chat.py)."""
    from openmanus_rl_core.rollout.chat import prompt_tools

    return prompt_tools(template, env, chat, template.system_prompt(played_instruction(env, instruction)))


def _demonstration(chat: Any, template: Any, system: str, tools: list[dict] | None, end_ids: list[int], obs0: str,
                   steps: list[tuple[str, str]]) -> tuple[list[int], list[int]]:
    """``(input_ids, loss_mask)`` of one episode (module docstring)."""
    ids = chat.prompt_ids(system, obs0, tools)
    mask = [0] * len(ids)
    for i, (action, obs) in enumerate(steps):
        reply = chat.encode(template.render(action)) + end_ids
        ids += reply
        mask += [1] * len(reply)
        if i < len(steps) - 1:
            delta = chat.obs_ids(chat.encode(obs), reply)
            ids += delta
            mask += [0] * len(delta)
    return ids, mask


def demo_batch(demos: Sequence[tuple[list[int], list[int]]], pad_token_id: int) -> Batch:
    """Right-padded tensors ``input_ids, attention_mask, position_ids, loss_mask`` ``[B, L]``."""
    L = max(len(ids) for ids, _ in demos)
    B = len(demos)
    input_ids = torch.full((B, L), int(pad_token_id), dtype=torch.long)
    attn = torch.zeros((B, L), dtype=torch.long)
    loss_mask = torch.zeros((B, L), dtype=torch.float32)
    for i, (ids, mask) in enumerate(demos):
        input_ids[i, : len(ids)] = torch.as_tensor(ids)
        attn[i, : len(ids)] = 1
        loss_mask[i, : len(ids)] = torch.as_tensor(mask, dtype=torch.float32)
    position_ids = (attn.cumsum(-1) - 1).clamp_min(0)
    return Batch(tensors={"input_ids": input_ids, "attention_mask": attn, "position_ids": position_ids,
                          "loss_mask": loss_mask})


def run_warmup(step_fn: Callable[[list[Batch], float], list[dict]], demos: Sequence[tuple[list[int], list[int]]],
               pad_token_id: int, world_size: int, steps: int, batch_size: int, lr: float, seed: int,
               warmup_ratio: float = 0.1, log: Callable[[str], None] | None = None,
               lr_schedule: str = "constant") -> dict[str, float]:
    """``steps`` supervised steps over shuffled demonstrations; returns ``warmup/*`` metrics.

    ``step_fn(shards, lr)`` runs one step on every worker (``shards[r]`` for rank ``r``; all the same size) and
    returns each rank's metrics. LR: linear ramp over ``warmup_ratio * steps`` steps, then ``constant`` or
    ``cosine`` (decay to 10%). Constant is the default: what the warm-up must learn (copying a word from the
    observation) appears abruptly after a plateau, and a decaying LR delays it. The order of demonstrations is a
    fixed function of ``seed``. ``log`` hears the step and loss at least every :data:`alive.EVERY_S` seconds.
    """
    from openmanus_rl_core.algorithms.schedules import make_lr_lambda

    lr_at = make_lr_lambda(lr_schedule, steps, max(1, int(warmup_ratio * steps)), min_lr_ratio=0.1)
    t0 = time.perf_counter()
    n = len(demos)
    if n == 0 or steps <= 0:
        return {}
    per_rank = max(1, -(-int(batch_size) // world_size))
    size = per_rank * world_size
    rng = np.random.default_rng([int(seed), 7])
    order: list[int] = []
    losses, accs = [], []
    last: dict[str, float] = {}
    skipped = 0
    with Alive(log, "warm-up", total=int(steps), unit="steps") as progress:
        for s in range(int(steps)):
            while len(order) < size:
                order.extend(rng.permutation(n).tolist())
            idx, order = order[:size], order[size:]
            # Sort by length inside the step so each rank's shard pads little (the step's sample set is unchanged).
            idx.sort(key=lambda i: len(demos[i][0]))
            shards = [demo_batch([demos[i] for i in idx[r::world_size]], pad_token_id) for r in range(world_size)]
            results = step_fn(shards, float(lr) * lr_at(s))
            last = {k: float(np.mean([r[k] for r in results])) for k in results[0]}
            losses.append(last["loss"])
            accs.append(last.get("token_acc", float("nan")))
            skipped += int(max(r.get("skipped", 0.0) for r in results))
            if s == 0 or (s + 1) % max(1, steps // 5) == 0 or s == steps - 1:
                progress.say(f"warm-up step {s + 1}/{steps}: loss {last['loss']:.4f} token acc "
                             f"{last.get('token_acc', 0):.3f}")
            progress.update(s + 1, note=f"loss {last['loss']:.4f}")
    tail = max(1, len(losses) // 10)
    return {
        "warmup/loss": float(np.mean(losses[-tail:])),
        "warmup/first_loss": float(losses[0]),
        "warmup/token_acc": float(np.mean(accs[-tail:])),
        "warmup/steps": float(steps),
        "warmup/demonstrations": float(n),
        "warmup/skipped_steps": float(skipped),
        "warmup/seconds": time.perf_counter() - t0,
    }


def warm_up(trainer: Any) -> dict[str, float]:
    """The supervised warm-up of ``trainer``'s actor on demonstrations (its own tasks' or the env's oracle), then
    the weights into the engines; its metrics ({} when off or when there is nothing to learn from)."""
    wcfg = trainer.cfg.warmup
    if not wcfg.enabled or wcfg.steps <= 0:
        return {}
    t0 = time.perf_counter()
    # Demonstrations come from the training tasks only (never the validation tasks).
    demo_tasks = trainer.train_tasks[:wcfg.num_demos or len(trainer.train_tasks)]
    played: list[dict] = []
    demonstrator = wcfg.demonstrator
    if demonstrator == "model":  # the model plays every task first: each then carries its own demonstration
        demo_tasks, demonstrator = model_demonstrations(trainer.cfg, trainer.env_factory, trainer.template,
                                                        demo_tasks), "oracle"
    demos = build_demonstrations(trainer.env_factory, trainer.template, trainer.tokenizer, demo_tasks,
                                 trainer.cfg.rollout.max_turns, log=trainer.log, demonstrator=demonstrator,
                                 keep=wcfg.keep, played=played)
    if not demos:
        trainer.can_warm_up = False
        why = (f"none of the {len(played)} demonstrations succeeded (warmup.keep=success)" if played else
               f"env {trainer.cfg.env.name!r} has no oracle and the training tasks carry no demonstrations")
        trainer.log(f"warm-up skipped: {why} (warmup.enabled=false silences this)")
        return {}

    def step_fn(shards, lr):
        return trainer.actor.call_each("sft_update", [(s, lr, wcfg.grad_clip) for s in shards])

    metrics = run_warmup(step_fn, demos, trainer.pad_token_id, trainer.actor.size, wcfg.steps, wcfg.batch_size,
                         wcfg.lr, trainer.seed, wcfg.warmup_ratio, log=trainer.log, lr_schedule=wcfg.lr_schedule)
    trainer.actor.call("end_warmup")
    trainer.actor.call("sync_rollout_weights")
    metrics["warmup/seconds"] = time.perf_counter() - t0
    metrics["warmup/from_data"] = float(sum(bool(t.get("demonstration")) for t in demo_tasks))
    metrics["warmup/played"] = float(len(played))  # demonstrations before warmup.keep; their success and reward:
    metrics["warmup/demo_success"] = float(np.mean([p["success"] for p in played]))
    rewards = [p["reward"] for p in played if not np.isnan(p["reward"])]  # a task's own demonstration may have none
    metrics["warmup/demo_reward"] = float(np.mean(rewards)) if rewards else float("nan")
    return metrics


def step_zero(trainer: Any) -> dict[str, float]:
    """Step 0 of a fresh run: the untrained model's validation (``trainer.val_before_train``), then the warm-up
    and, with ``warmup.validate``, the warmed-up model's; their metrics, logged as step 0 (empty when none ran)."""
    first: dict[str, float] = {}
    if trainer.cfg.trainer.val_before_train:
        first.update(validate(trainer, 0))
        trainer.log(f"step 0 (untrained): val reward {first['val/reward_mean']:.3f}, "
                    f"success {first['val/success_rate']:.3f}")
    wm = warm_up(trainer)
    if wm:
        first.update(wm)
        msg = f"warm-up: {int(wm['warmup/steps'])} steps in {wm['warmup/seconds']:.1f}s, loss {wm['warmup/loss']:.4f}"
        if trainer.cfg.warmup.validate:
            post = validate(trainer, 0, prefix="warmup/val")
            first.update(post)
            msg += (f"; val reward after warm-up {post['warmup/val/reward_mean']:.3f}, "
                    f"success {post['warmup/val/success_rate']:.3f}")
        trainer.log(msg)
    return first
