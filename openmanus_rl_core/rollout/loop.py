"""The multi-turn agent loop: tasks in, training-ready trajectories out.

Per turn, :class:`AgentLoop` makes ONE :meth:`RolloutEngine.generate` call over every live episode, then runs
every live episode's ``env.step`` concurrently (threads, each call with its own timeout). Token-in, token-out:
an episode's tokens are exactly the ones the model saw and produced; nothing decoded is ever re-tokenized.

Token layout of one episode (``P`` prompt tokens, then the response tokens; mask = response_mask)::

    prompt   = chat([system(template.system_prompt(env.instruction)), user(first observation)], gen. prompt)
               (with a tool-calling template, the env's tools too: chat.prompt_tools)
    response = reply_0 | obs_delta_0 | reply_1 | obs_delta_1 | ... | reply_k
                mask 1       mask 0       mask 1      mask 0            mask 1

``reply_t`` holds the generated ids as returned by the engine (its EOS ``<|im_end|>`` included when the model
produced it: mask 1, so the model learns to end its turn). ``obs_delta_t`` is what the chat template puts between
an assistant reply and the next assistant reply: the end of the assistant turn (``<|im_end|>`` if the model did
not produce it itself, e.g. after a stop string or the token limit), the user turn carrying the observation
(its tokens cut to ``max_obs_tokens``, keeping head and tail), and the next assistant header. The template pieces are found once per
tokenizer by rendering a conversation with fixed dummy contents (:class:`ChatDelta`). No observation follows the
last reply (nothing would be generated after it). ``Turn.span`` is reply_t's ``[start, end)`` in the response.

Termination reasons (``protocols.TERMINATIONS``): ``done`` (the env said so), ``max_turns``, ``truncated``
(prompt / response / observation token limits: the next observation or reply does not fit), ``env_error`` (the
env's factory, ``reset`` or ``step`` raised, hung past ``env_timeout_s``, or returned something that is not a
``StepResult``; the message is in ``Trajectory.error``), ``invalid`` (the model produced an empty reply).

With ``rollout.constrain_actions``, each reply of an env that names its legal actions (``env.action_choices()``,
asked after the reset and after every step that leaves the episode running) is decoded as one of them: the
episode's row of the generate call carries that grammar (``rollout/choices.py``).

With a per-turn :class:`~openmanus_rl_core.protocols.Memory` (any but ``full``), each reply is its own sample::

    context_t = chat(memory.messages(system, first observation, past turns), generation prompt)
    sample_t  = context_t | reply_t          (reply mask 1; the engine's log-probs)

``context_t`` is cut to ``max_sample_tokens - max_new_tokens`` by dropping the oldest past turns the memory sees
(then, if still too long, keeping its last tokens); ``max_response_tokens`` does not bound such an episode. The
episode's ``response_ids`` hold the replies back to back, so allocators and ``Turn.span`` work as with ``full``.
A memory with a model-written summary has it written right before each generate call (``rollout/summaries.py``).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from openmanus_rl_core.protocols import (
    Memory,
    ParsedAction,
    PastTurn,
    RolloutEngine,
    SamplingParams,
    StepResult,
    Trajectory,
    Turn,
)
from openmanus_rl_core.rollout.chat import ChatDelta, prompt_tools
from openmanus_rl_core.rollout.choices import allowed_at, choice_constraint, env_choices
from openmanus_rl_core.rollout.env_pool import CallStatus, EnvCallPool, describe_error
from openmanus_rl_core.rollout.episode import Episode, LiveEpisode
from openmanus_rl_core.rollout.episodes import EpisodeRunner
from openmanus_rl_core.rollout.summaries import SummaryWriter, writes_summaries
from openmanus_rl_core.rollout.tasks import start_task
from openmanus_rl_core.config.schema import RolloutConfig

GAP = "\n[...]\n"  # stands for the middle of an observation cut to max_obs_tokens


def sampling_params(cfg: RolloutConfig, stop: Sequence[str] = ()) -> SamplingParams:
    """The engine's sampling settings of one rollout (``cfg``: the ``rollout`` section of the schema)."""
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                          top_k=cfg.top_k, stop=list(stop), greedy=cfg.greedy)

class AgentLoop:
    """Runs episodes of one env kind with one template against one engine.

    ``env_factory()`` builds a fresh env per episode (``env.close()`` is always called, also after an error);
    ``template`` is a ``protocols.ActionTemplate`` (its ``stop`` strings end a reply); ``tokenizer`` is the
    engine's tokenizer (its chat template builds the token layout, see the module doc). ``memory``: what context
    each reply sees; None or a memory with ``per_turn = False`` concatenates the whole episode.

    After :meth:`run`, ``self.stats`` holds timings of the last run: ``turns`` (per turn: live episodes,
    ``gen_s``, ``env_s``), ``reset_s``, ``total_s``, ``generate_calls``.
    """

    def __init__(self, engine: RolloutEngine, tokenizer: Any, template: Any, env_factory: Callable[[], Any],
                 cfg: RolloutConfig | None = None, memory: Memory | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.env_factory = env_factory
        self.cfg = cfg or RolloutConfig()
        self.chat = ChatDelta(tokenizer)
        self.memory = memory
        self.per_turn = bool(memory is not None and memory.per_turn)
        self.summaries = SummaryWriter(self) if writes_summaries(memory) else None
        self.stats: dict[str, Any] = {}
        # The policy version (completed optimizer steps) of the engine's weights: every generated token records it.
        self.version = 0
        # Checked between turns and while env calls run: once true, run() gives up (stopping.Abandoned).
        self.abandon: Callable[[], bool] | None = None
        self.grammars: Any = None  # rollout.constrain_actions: replays each reply's grammar (rollout/choices.py)

    def check_abandon(self) -> None:
        if self.abandon is not None and self.abandon():
            from openmanus_rl_core.process.stopping import Abandoned

            raise Abandoned("rollout abandoned: the run is stopping")

    # -------------------------------------------------------------------------------------- helpers
    def _obs_tokens(self, text: str) -> tuple[list[int], bool]:
        """The observation's tokens, cut to ``max_obs_tokens``: its head and its tail around a gap marker.

        Envs put what matters at either end (TextCraft's goal is the last line of a long recipe list; most envs
        open with the situation), so both ends are kept: ``head = (limit - len(marker)) // 2`` tokens, the marker
        ``GAP``, then the last tokens. Limits too small for the marker keep the head only.
        """
        ids = self.chat.encode(text)
        limit = self.cfg.max_obs_tokens
        if len(ids) <= limit:
            return ids, False
        gap = self.chat.encode(GAP)
        room = limit - len(gap)
        if room < 2:
            return ids[:limit], True
        head = room // 2
        return ids[:head] + gap + ids[len(ids) - (room - head):], True

    def _start(self, live: LiveEpisode) -> str:
        live.env = self.env_factory()
        return start_task(live.env, live.ep.trajectory.task)

    def _first_prompt(self, live: LiveEpisode, obs: str) -> None:
        ep, cfg = live.ep, self.cfg
        instruction = getattr(live.env, "instruction", "") or ""
        system, live.tools = prompt_tools(self.template, live.env, self.chat,
                                          self.template.system_prompt(str(instruction)))
        obs_ids, cut = self._obs_tokens(obs)
        shown = self.tokenizer.decode(obs_ids) if cut else obs
        if self.per_turn:
            live.system, live.task = system, shown
            ep.prompt_ids = self._context(live)
            if cut:
                ep.truncated = True
                ep.trajectory.info["obs_truncated"] = ep.trajectory.info.get("obs_truncated", 0) + 1
            live.obs = obs
            return
        ids = self.chat.prompt_ids(system, shown, live.tools)
        if len(ids) > cfg.max_prompt_tokens:
            # Still too long (a long system prompt): keep the end, where the observation and the header are.
            ids = ids[-cfg.max_prompt_tokens:]
            ep.trajectory.info["prompt_truncated"] = True
            cut = True
        if cut:
            ep.truncated = True
            ep.trajectory.info["obs_truncated"] = ep.trajectory.info.get("obs_truncated", 0) + 1
        ep.prompt_ids = ids
        live.obs = obs

    def _context(self, live: LiveEpisode) -> list[int]:
        """Per-turn memories: the next reply's context, fitted to the sample budget; appended to ``contexts``."""
        ep, cfg = live.ep, self.cfg
        limit = cfg.max_sample_tokens - cfg.max_new_tokens
        history = live.history
        for drop in range(len(history) + 1):
            messages = (self.memory.messages(live.system, live.task, history[drop:], summary=live.summary)
                        if self.summaries else self.memory.messages(live.system, live.task, history[drop:]))
            text = self.tokenizer.apply_chat_template(messages, tools=live.tools, tokenize=False,
                                                      add_generation_prompt=True)
            ids = self.chat.encode(text)
            if len(ids) <= limit:
                break
        if drop:
            ep.trajectory.info["context_turns_dropped"] = ep.trajectory.info.get("context_turns_dropped", 0) + drop
        if len(ids) > limit:
            # Even the task alone does not fit: keep the end, where the observation and the header are.
            ids = ids[-limit:]
            ep.trajectory.info["context_truncated"] = ep.trajectory.info.get("context_truncated", 0) + 1
        ep.contexts.append(ids)
        return ids

    def _parse(self, text: str) -> tuple[ParsedAction, str | None]:
        try:
            parsed = self.template.parse(text)
            if not isinstance(parsed, ParsedAction):
                raise TypeError(f"template.parse returned {type(parsed).__name__}, not ParsedAction")
            return parsed, None
        except Exception as exc:  # the protocol says parse never raises; a buggy template must not stop the batch
            return ParsedAction(kind="invalid", content=text, valid=False), describe_error(exc)

    # ------------------------------------------------------------------------------------ one episode
    def _new_live(self, task: Mapping[str, Any]) -> LiveEpisode:
        task = dict(task)
        traj = Trajectory(
            task_id=task.get("task_id"), seed=task.get("seed"),
            group_id=task.get("group_id") or uuid.uuid4().hex, initial_observation="", task=task,
        )
        traj.info["finish_reasons"] = []
        return LiveEpisode(Episode(trajectory=traj, prompt_ids=[]))

    def _take_reset(self, lv: LiveEpisode, status: CallStatus, value: Any) -> None:
        if status is CallStatus.OK and isinstance(value, str):
            lv.ep.trajectory.initial_observation = value
            try:
                self._first_prompt(lv, value)
            except Exception as exc:  # a template's system_prompt that raises ends only this episode
                lv.finish("env_error", f"building the first prompt failed: {describe_error(exc)}")
                return
            self._choose(lv)
        elif status is CallStatus.OK:
            lv.finish("env_error", f"env.reset returned {type(value).__name__}, not str")
        elif status is CallStatus.TIMEOUT:
            lv.finish("env_error", f"env reset timed out after {self.cfg.env_timeout_s:g}s")
        else:
            lv.finish("env_error", f"env reset failed: {describe_error(value)}")

    def _prepare(self, lives: Sequence[LiveEpisode]) -> None:
        """Right before generating for ``lives``: write the summaries they wait for, then build their contexts."""
        waiting = [lv for lv in lives if lv.pending]
        if not waiting:
            return
        self.summaries.write(waiting)
        for lv in waiting:
            lv.pending = False
            self._context(lv)

    def _prompt(self, lv: LiveEpisode) -> list[int]:
        """The tokens the next reply of ``lv`` continues."""
        return lv.ep.contexts[-1] if self.per_turn else lv.ep.prompt_ids + lv.ep.response_ids

    def _params(self) -> SamplingParams:
        return sampling_params(self.cfg, list(getattr(self.template, "stop", []) or []))

    def _choose(self, lv: LiveEpisode) -> None:
        """``rollout.constrain_actions``: the next reply of ``lv`` is one of its env's legal actions
        (``rollout/choices.py``); an env or template that fails at it ends only this episode."""
        if not self.cfg.constrain_actions:
            return
        try:
            lv.constraint = choice_constraint(self.template, env_choices(lv.env))
        except Exception as exc:
            lv.finish("env_error", f"rollout.constrain_actions: the legal actions' constraint failed: "
                                   f"{describe_error(exc)}")

    @staticmethod
    def _constrained(params: SamplingParams, lives: Sequence[LiveEpisode]) -> SamplingParams:
        """``params`` for one generate call over ``lives``, each row with its episode's constraint (if any has one)."""
        if all(lv.constraint is None for lv in lives):
            return params
        return dataclasses.replace(params, constraint=[lv.constraint for lv in lives])

    def _end(self, lives: Sequence[LiveEpisode], total: float) -> list[Episode]:
        for lv in lives:
            lv.ep.trajectory.response_length = len(lv.ep.response_ids)
            lv.ep.trajectory.info["rollout_time_s"] = total
        return [lv.ep for lv in lives]

    # ------------------------------------------------------------------------------------------- run
    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
        """Run one episode per task (already expanded: see :func:`expand_tasks`); returns them in order.

        A task is a mapping with ``task_id``, ``seed`` (either may be None) and optionally ``group_id`` (default:
        a fresh uuid per task); the whole mapping is kept in ``Trajectory.task`` for reward components.
        """
        cfg = self.cfg
        self.check_abandon()
        # The engine's prefix cache starts empty (protocols.RolloutEngine): a resumed run samples as an
        # uninterrupted one does.
        reset = getattr(self.engine, "reset_prefix_cache", None)
        if reset is not None:
            reset()
        if cfg.mode == "episodes":  # each episode on its own: rollout/episodes.py
            runner = EpisodeRunner(self)
            episodes = runner.run(tasks)
            self.stats = runner.stats
            return episodes
        t_run = time.perf_counter()
        workers = cfg.env_workers if cfg.env_workers else 0
        pool = EnvCallPool(workers)
        lives = [self._new_live(task) for task in tasks]
        stats: dict[str, Any] = {"turns": [], "generate_calls": 0}
        self.stats = stats

        try:
            # Reset every env concurrently.
            t0 = time.perf_counter()
            results = pool.collect([pool.submit(self._start, lv) for lv in lives], cfg.env_timeout_s, self.abandon)
            stats["reset_s"] = time.perf_counter() - t0
            for lv, (status, value) in zip(lives, results):
                self._take_reset(lv, status, value)

            params = self._params()
            for turn in range(cfg.max_turns):
                live = [lv for lv in lives if not lv.done]
                if not live:
                    break
                self.check_abandon()
                # ONE batched generate over every live episode.
                self._prepare(live)
                t0 = time.perf_counter()
                prompts = [self._prompt(lv) for lv in live]
                gens = self.engine.generate(prompts, self._constrained(params, live))
                gen_s = time.perf_counter() - t0
                stats["generate_calls"] += 1
                if len(gens) != len(live):
                    raise RuntimeError(f"engine returned {len(gens)} generations for {len(live)} prompts")

                stepping: list[tuple[LiveEpisode, Turn]] = []
                for lv, gen in zip(live, gens):
                    turn_obj = self._take_reply(lv, gen)
                    if turn_obj is not None:
                        stepping.append((lv, turn_obj))

                # Every stepping env concurrently, each call with its own timeout.
                t0 = time.perf_counter()
                futs = [pool.submit(lv.env.step, tr.action.content) for lv, tr in stepping]
                results = pool.collect(futs, cfg.env_timeout_s, self.abandon)
                env_s = time.perf_counter() - t0
                for (lv, tr), (status, value) in zip(stepping, results):
                    self._take_step(lv, tr, status, value, turn)
                stats["turns"].append({"live": len(live), "stepped": len(stepping), "gen_s": gen_s, "env_s": env_s})
            for lv in lives:
                if not lv.done:
                    lv.finish("max_turns")
        finally:  # abandoned: no waiting for envs that may still be in a call
            self._close_all(pool, lives, 1.0 if self.abandon is not None and self.abandon() else None)
            pool.shutdown()  # no idle threads left behind: the trainer runs the loop thousands of times

        total = time.perf_counter() - t_run
        stats["total_s"] = total
        return self._end(lives, total)

    def _take_reply(self, lv: LiveEpisode, gen: Any) -> Turn | None:
        """Append one generation; return the Turn to step the env with, or None if the episode ended here."""
        ep, cfg = lv.ep, self.cfg
        traj = ep.trajectory
        ids, lps = list(gen.token_ids), [float(x) for x in gen.logprobs]
        if len(lps) != len(ids):
            raise RuntimeError(f"engine returned {len(lps)} logprobs for {len(ids)} tokens")
        # A per-turn sample's reply is bounded by max_new_tokens alone (its context was fitted before).
        room = len(ids) if self.per_turn else cfg.max_response_tokens - len(ep.response_ids)
        cut = len(ids) > room
        if cut:
            ids, lps = ids[:room], lps[:room]
        text = gen.text if not cut else self.tokenizer.decode(ids, skip_special_tokens=True)
        start = len(ep.response_ids)
        ep.response_ids.extend(ids)
        ep.response_mask.extend([1] * len(ids))
        ep.logprobs.extend(lps)
        ep.versions.extend([self.version] * len(ids))
        if lv.constraint is not None:
            for i, allowed in enumerate(allowed_at(self, lv.constraint, ids)):
                ep.choices[start + i] = allowed
        ep.anchor_obs.append(lv.obs)
        traj.info["finish_reasons"].append("length" if cut else gen.finish_reason)
        parsed, perr = self._parse(text)
        tr = Turn(response=text, action=parsed, observation="", reward=0.0, done=False, info={},
                  span=(start, start + len(ids)))
        if perr:
            tr.info["parse_error"] = perr
        traj.turns.append(tr)
        lv.generation = ids
        if cut:
            tr.info["truncated"] = True
            lv.finish("truncated")
            return None
        if not text.strip():
            lv.finish("invalid", "the model produced an empty reply")
            return None
        return tr

    def _take_step(self, lv: LiveEpisode, tr: Turn, status: CallStatus, value: Any, turn: int) -> None:
        ep, cfg = lv.ep, self.cfg
        traj = ep.trajectory
        if status is CallStatus.TIMEOUT:
            lv.finish("env_error", f"env.step timed out after {cfg.env_timeout_s:g}s (turn {turn})")
            return
        if status is CallStatus.ERROR:
            lv.finish("env_error", f"env.step failed (turn {turn}): {describe_error(value)}")
            return
        if not isinstance(value, StepResult) or not isinstance(value.observation, str):
            lv.finish("env_error", f"env.step returned {value!r:.200}, not a StepResult with a str observation")
            return
        try:
            reward = float(value.reward)
        except (TypeError, ValueError):
            lv.finish("env_error", f"env.step returned a non-numeric reward {value.reward!r:.100}")
            return
        tr.observation, tr.reward, tr.done = value.observation, reward, bool(value.done)
        tr.info = {**dict(value.info or {}), **tr.info}
        if "success" in (value.info or {}):
            traj.success = bool(value.info["success"])
        if tr.done:
            lv.finish("done")
            return
        if turn + 1 >= cfg.max_turns:
            return  # the loop ends it as max_turns; no observation tokens after the last reply
        self._choose(lv)
        if lv.done:
            return
        obs_ids, obs_cut = self._obs_tokens(value.observation)
        if self.per_turn:
            if obs_cut:
                ep.truncated = True
                traj.info["obs_truncated"] = traj.info.get("obs_truncated", 0) + 1
            shown = self.tokenizer.decode(obs_ids) if obs_cut else value.observation
            lv.history.append(PastTurn(reply=tr.response, action=tr.action.content, observation=shown))
            lv.obs = value.observation
            if self.summaries:
                lv.pending = True  # the summary is written with the others', right before generating
            else:
                self._context(lv)
            return
        delta = self.chat.obs_ids(obs_ids, lv.generation)
        if obs_cut:
            ep.truncated = True
            traj.info["obs_truncated"] = traj.info.get("obs_truncated", 0) + 1
        if len(ep.response_ids) + len(delta) >= cfg.max_response_tokens:
            # The observation and at least one reply token would not fit.
            lv.finish("truncated")
            return
        ep.response_ids.extend(delta)
        ep.response_mask.extend([0] * len(delta))
        ep.logprobs.extend([0.0] * len(delta))
        ep.versions.extend([-1] * len(delta))
        lv.obs = value.observation

    def _close_all(self, pool: EnvCallPool, lives: Sequence[LiveEpisode], timeout: float | None = None) -> None:
        with_env = [lv for lv in lives if lv.env is not None]
        timeout = min(self.cfg.env_timeout_s, 10.0) if timeout is None else timeout
        results = pool.collect([pool.submit(lv.env.close) for lv in with_env], timeout)
        for lv, (status, value) in zip(with_env, results):
            if status is not CallStatus.OK:
                lv.ep.trajectory.info["close_error"] = "timed out" if status is CallStatus.TIMEOUT else describe_error(value)


