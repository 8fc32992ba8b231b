"""The multi-turn agent loop: tasks in, training-ready trajectories out.

Per turn, :class:`AgentLoop` makes ONE :meth:`RolloutEngine.generate` call over every live episode, then runs
every live episode's ``env.step`` concurrently (threads, each call with its own timeout). Token-in, token-out:
an episode's tokens are exactly the ones the model saw and produced; nothing decoded is ever re-tokenized.

Token layout of one episode (``P`` prompt tokens, then the response tokens; mask = response_mask)::

    prompt   = chat([system(template.system_prompt(env.instruction)), user(first observation)], gen. prompt)
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
"""

from __future__ import annotations

import concurrent.futures as cf
import enum
import math
import queue
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from openmanus_rl_core.protocols import (
    TERMINATIONS,
    ParsedAction,
    RolloutEngine,
    SamplingParams,
    StepResult,
    Trajectory,
    Turn,
)
from openmanus_rl_core.schema import RolloutConfig

__all__ = [
    "RolloutConfig",
    "sampling_params",
    "Episode",
    "AgentLoop",
    "ChatDelta",
    "EnvCallPool",
    "expand_tasks",
    "build_batch",
    "rollout_metrics",
    "tokenizer_corpus",
]


GAP = "\n[...]\n"  # stands for the middle of an observation cut to max_obs_tokens


# ------------------------------------------------------------------------------------------------- config
def sampling_params(cfg: RolloutConfig, stop: Sequence[str] = ()) -> SamplingParams:
    """The engine's sampling settings of one rollout (``cfg``: the ``rollout`` section of the schema)."""
    return SamplingParams(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_p=cfg.top_p,
                          top_k=cfg.top_k, stop=list(stop), greedy=cfg.greedy)


# -------------------------------------------------------------------------------------------------- tasks
def expand_tasks(tasks: Sequence[Mapping[str, Any]], n: int) -> list[dict[str, Any]]:
    """``n`` interleaved copies of each task (``a, a, b, b`` for n=2), each copy carrying its task's ``group_id``.

    A task that already has a ``group_id`` keeps it; otherwise its copies share a fresh uuid hex. ``task_id`` and
    ``seed`` are the same within a group (so every sample starts from the same state).
    """
    if int(n) < 1:
        raise ValueError(f"n must be >= 1, got {n!r}")
    out: list[dict[str, Any]] = []
    for task in tasks:
        gid = task.get("group_id") or uuid.uuid4().hex
        for _ in range(int(n)):
            copy = dict(task)
            copy["group_id"] = gid
            out.append(copy)
    return out


# ------------------------------------------------------------------------------------------ chat template
class ChatDelta:
    """The token pieces a chat template puts around turns, found once from fixed dummy contents.

    - ``prompt_ids(system, user)``: the first prompt, ending with the assistant header.
    - ``obs_ids(obs_ids, reply_ids)``: tokens between a reply and the next reply: ``[<end of assistant turn>] +
      <user header> + obs_ids + <end of user turn> + <assistant header>``; the end-of-turn tokens are left out when
      the reply already ends with them (the model generated its EOS).
    """

    _D = ("OMRLdummyA", "OMRLdummyB", "OMRLdummyC", "OMRLdummyS")

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        a, b, c, s = self._D
        full = self._render([("system", s), ("user", a), ("assistant", b), ("user", c)], True)
        closed = self._render([("system", s), ("user", a), ("assistant", b)], False)
        for d in (b, c):
            if full.count(d) != 1:
                raise ValueError("the tokenizer's chat template does not render plain message contents verbatim; "
                                 "it cannot be used for multi-turn rollouts")
        mid = full[full.index(b) + len(b): full.index(c)]
        tail = full[full.index(c) + len(c):]
        close = closed[closed.index(b) + len(b):] if closed.count(b) == 1 else ""
        self.mid_ids = self.encode(mid)
        self.tail_ids = self.encode(tail)
        # The assistant turn's end marker (e.g. "<|im_end|>", without the newline that follows it).
        self.end_ids = self.encode(close.rstrip()) if close.strip() else []
        if self.end_ids and self.mid_ids[: len(self.end_ids)] != self.end_ids:
            self.end_ids = []

    def _render(self, messages: list[tuple[str, str]], gen: bool) -> str:
        return self.tokenizer.apply_chat_template(
            [{"role": r, "content": t} for r, t in messages], tokenize=False, add_generation_prompt=gen
        )

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def prompt_ids(self, system: str, user: str) -> list[int]:
        text = self._render([("system", system), ("user", user)], True)
        return self.encode(text)

    def obs_ids(self, obs_ids: Sequence[int], reply_ids: Sequence[int]) -> list[int]:
        mid = self.mid_ids
        k = len(self.end_ids)
        if k and len(reply_ids) >= k and list(reply_ids[-k:]) == self.end_ids:
            mid = mid[k:]
        return list(mid) + list(obs_ids) + list(self.tail_ids)


# --------------------------------------------------------------------------------------------- env calls
class CallStatus(enum.Enum):
    """How one env call (reset, step, close) run by :class:`EnvCallPool` ended."""

    OK = "ok"
    ERROR = "error"
    TIMEOUT = "timeout"


class EnvCallPool:
    """Threads for blocking env calls, each call with its own timeout.

    Why not ``ThreadPoolExecutor``: a hung env call can never be interrupted, and the executor's worker threads
    are joined at interpreter exit, so one env that never answers would hang the process forever. These workers
    are daemon threads; a timed-out call's thread is abandoned (and replaced, so hung envs cannot starve the
    pool). ``max_workers=0``: a new thread whenever every thread is busy.
    """

    def __init__(self, max_workers: int = 0):
        self.max_workers = int(max_workers)
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads = 0
        self._idle = 0
        self._pending = 0
        self._abandoned = 0

    def submit(self, fn: Callable[..., Any], *args: Any) -> cf.Future:
        fut: cf.Future = cf.Future()
        with self._lock:
            self._pending += 1
            cap = self.max_workers + self._abandoned if self.max_workers else math.inf
            spawn = self._pending > self._idle and self._threads < cap
            if spawn:
                self._threads += 1
        self._q.put((fut, fn, args))
        if spawn:
            threading.Thread(target=self._work, name="omrl-env", daemon=True).start()
        return fut

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._q.get()
            with self._lock:
                self._idle -= 1
                if item is None:  # shutdown
                    self._threads -= 1
                    return
                self._pending -= 1
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            fut.started_at = time.monotonic()  # type: ignore[attr-defined]
            try:
                fut.set_result(fn(*args))
            except BaseException as exc:  # noqa: BLE001  (everything an env raises becomes that episode's error)
                fut.set_exception(exc)

    def shutdown(self) -> None:
        """Let every worker exit once it is free (a hung one when its call returns). Submit no more after this."""
        with self._lock:
            n = self._threads
        for _ in range(n):
            self._q.put(None)

    def collect(self, futs: Sequence[cf.Future], timeout: float) -> list[tuple[str, Any]]:
        """Wait for every future; each gets ``timeout`` seconds from the moment its call started.

        Returns, in order, ``(CallStatus.OK, result)``, ``(CallStatus.ERROR, exception)`` or
        ``(CallStatus.TIMEOUT, None)``.
        """
        pending = set(futs)
        timed_out: set[cf.Future] = set()
        while pending:
            now = time.monotonic()
            deadlines = [getattr(f, "started_at", None) for f in pending]
            known = [d + timeout for d in deadlines if d is not None]
            for f in list(pending):
                s = getattr(f, "started_at", None)
                if s is not None and now >= s + timeout and not f.done():
                    pending.discard(f)
                    timed_out.add(f)
            if not pending:
                break
            wait_s = min(known) - now if known else 0.05
            if len(known) < len(deadlines):  # some calls are queued: re-check their start times soon
                wait_s = min(wait_s, 0.05)
            done, _ = cf.wait(pending, timeout=max(wait_s, 0.0), return_when=cf.FIRST_COMPLETED)
            pending -= done
        if timed_out:
            with self._lock:
                self._abandoned += len(timed_out)
        out: list[tuple[str, Any]] = []
        for f in futs:
            if f in timed_out:
                out.append((CallStatus.TIMEOUT, None))
            elif f.exception() is not None:
                out.append((CallStatus.ERROR, f.exception()))
            else:
                out.append((CallStatus.OK, f.result()))
        return out


# ------------------------------------------------------------------------------------------------ episode
@dataclass
class Episode:
    """One finished episode: its trajectory and its tokens.

    ``response_mask[i]`` is 1 on tokens the model generated, 0 on observation / chat-template tokens;
    ``logprobs`` is aligned with ``response_ids`` (the engine's log-prob on mask-1 tokens, 0 elsewhere).
    ``truncated``: a token limit cut something (the prompt, an observation, or the episode itself).
    ``anchor_obs[t]``: the observation turn ``t`` acted on. ``uid``: unique per sample.
    """

    trajectory: Trajectory
    prompt_ids: list[int]
    response_ids: list[int] = field(default_factory=list)
    response_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    truncated: bool = False
    anchor_obs: list[str] = field(default_factory=list)
    uid: str = field(default_factory=lambda: uuid.uuid4().hex)

    @property
    def group_id(self) -> Any:
        return self.trajectory.group_id

    @property
    def step_ids(self) -> list[int]:
        """Per response token: the turn index on that turn's reply tokens, -1 elsewhere."""
        out = [-1] * len(self.response_ids)
        for t, (s, e) in enumerate(self.trajectory.segments):
            out[s:e] = [t] * (e - s)
        return out


class _Live:
    """Book-keeping of one episode while it runs."""

    __slots__ = ("ep", "env", "obs", "done", "generation")

    def __init__(self, ep: Episode):
        self.ep = ep
        self.env: Any = None
        self.obs = ""  # the observation the next reply acts on
        self.done = False
        self.generation: Any = None


def start_task(env: Any, task: Mapping[str, Any]) -> str:
    """Start ``task`` on ``env``: by content (``env.reset_from_observation(task["observation"])``) where the row has
    an ``observation`` and the env can start from one, else ``env.reset(task_id, seed)``."""
    observation = task.get("observation")
    if observation and callable(getattr(env, "reset_from_observation", None)):
        return env.reset_from_observation(str(observation))
    return env.reset(task_id=task.get("task_id"), seed=task.get("seed"))


def _finish(live: _Live, termination: str, error: str | None = None) -> None:
    live.done = True
    live.ep.trajectory.termination = termination
    if error is not None:
        live.ep.trajectory.error = error
    live.ep.truncated = live.ep.truncated or termination == "truncated"


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


# -------------------------------------------------------------------------------------------------- loop
class AgentLoop:
    """Runs episodes of one env kind with one template against one engine.

    ``env_factory()`` builds a fresh env per episode (``env.close()`` is always called, also after an error);
    ``template`` is a ``protocols.ActionTemplate`` (its ``stop`` strings end a reply); ``tokenizer`` is the
    engine's tokenizer (its chat template builds the token layout, see the module doc).

    After :meth:`run`, ``self.stats`` holds timings of the last run: ``turns`` (per turn: live episodes,
    ``gen_s``, ``env_s``), ``reset_s``, ``total_s``, ``generate_calls``.
    """

    def __init__(self, engine: RolloutEngine, tokenizer: Any, template: Any, env_factory: Callable[[], Any],
                 cfg: RolloutConfig | None = None):
        self.engine = engine
        self.tokenizer = tokenizer
        self.template = template
        self.env_factory = env_factory
        self.cfg = cfg or RolloutConfig()
        self.chat = ChatDelta(tokenizer)
        self.stats: dict[str, Any] = {}

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

    def _start(self, live: _Live) -> str:
        live.env = self.env_factory()
        return start_task(live.env, live.ep.trajectory.task)

    def _first_prompt(self, live: _Live, obs: str) -> None:
        ep, cfg = live.ep, self.cfg
        instruction = getattr(live.env, "instruction", "") or ""
        system = self.template.system_prompt(str(instruction))
        obs_ids, cut = self._obs_tokens(obs)
        shown = self.tokenizer.decode(obs_ids) if cut else obs
        ids = self.chat.prompt_ids(system, shown)
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

    def _parse(self, text: str) -> tuple[ParsedAction, str | None]:
        try:
            parsed = self.template.parse(text)
            if not isinstance(parsed, ParsedAction):
                raise TypeError(f"template.parse returned {type(parsed).__name__}, not ParsedAction")
            return parsed, None
        except Exception as exc:  # the protocol says parse never raises; a buggy template must not stop the batch
            return ParsedAction(kind="invalid", content=text, valid=False), _describe(exc)

    # ------------------------------------------------------------------------------------------- run
    def run(self, tasks: Sequence[Mapping[str, Any]]) -> list[Episode]:
        """Run one episode per task (already expanded: see :func:`expand_tasks`); returns them in order.

        A task is a mapping with ``task_id``, ``seed`` (either may be None) and optionally ``group_id`` (default:
        a fresh uuid per task); the whole mapping is kept in ``Trajectory.task`` for reward components.
        """
        cfg = self.cfg
        t_run = time.perf_counter()
        workers = cfg.env_workers if cfg.env_workers else 0
        pool = EnvCallPool(workers)
        lives: list[_Live] = []
        for task in tasks:
            task = dict(task)
            traj = Trajectory(
                task_id=task.get("task_id"), seed=task.get("seed"),
                group_id=task.get("group_id") or uuid.uuid4().hex, initial_observation="", task=task,
            )
            traj.info["finish_reasons"] = []
            lives.append(_Live(Episode(trajectory=traj, prompt_ids=[])))
        stats: dict[str, Any] = {"turns": [], "generate_calls": 0}
        self.stats = stats

        try:
            # Reset every env concurrently.
            t0 = time.perf_counter()
            results = pool.collect([pool.submit(self._start, lv) for lv in lives], cfg.env_timeout_s)
            stats["reset_s"] = time.perf_counter() - t0
            for lv, (status, value) in zip(lives, results):
                if status is CallStatus.OK and isinstance(value, str):
                    lv.ep.trajectory.initial_observation = value
                    try:
                        self._first_prompt(lv, value)
                    except Exception as exc:  # a template's system_prompt that raises ends only this episode
                        _finish(lv, "env_error", f"building the first prompt failed: {_describe(exc)}")
                elif status is CallStatus.OK:
                    _finish(lv, "env_error", f"env.reset returned {type(value).__name__}, not str")
                elif status is CallStatus.TIMEOUT:
                    _finish(lv, "env_error", f"env reset timed out after {cfg.env_timeout_s:g}s")
                else:
                    _finish(lv, "env_error", f"env reset failed: {_describe(value)}")

            stop = list(getattr(self.template, "stop", []) or [])
            params = sampling_params(cfg, stop)
            for turn in range(cfg.max_turns):
                live = [lv for lv in lives if not lv.done]
                if not live:
                    break
                # ONE batched generate over every live episode.
                t0 = time.perf_counter()
                gens = self.engine.generate([lv.ep.prompt_ids + lv.ep.response_ids for lv in live], params)
                gen_s = time.perf_counter() - t0
                stats["generate_calls"] += 1
                if len(gens) != len(live):
                    raise RuntimeError(f"engine returned {len(gens)} generations for {len(live)} prompts")

                stepping: list[tuple[_Live, Turn]] = []
                for lv, gen in zip(live, gens):
                    turn_obj = self._take_reply(lv, gen)
                    if turn_obj is not None:
                        stepping.append((lv, turn_obj))

                # Every stepping env concurrently, each call with its own timeout.
                t0 = time.perf_counter()
                futs = [pool.submit(lv.env.step, tr.action.content) for lv, tr in stepping]
                results = pool.collect(futs, cfg.env_timeout_s)
                env_s = time.perf_counter() - t0
                for (lv, tr), (status, value) in zip(stepping, results):
                    self._take_step(lv, tr, status, value, turn)
                stats["turns"].append({"live": len(live), "stepped": len(stepping), "gen_s": gen_s, "env_s": env_s})
            for lv in lives:
                if not lv.done:
                    _finish(lv, "max_turns")
        finally:
            self._close_all(pool, lives)
            pool.shutdown()  # no idle threads left behind: the trainer runs the loop thousands of times

        total = time.perf_counter() - t_run
        stats["total_s"] = total
        for lv in lives:
            lv.ep.trajectory.response_length = len(lv.ep.response_ids)
            lv.ep.trajectory.info["rollout_time_s"] = total
        return [lv.ep for lv in lives]

    def _take_reply(self, lv: _Live, gen: Any) -> Turn | None:
        """Append one generation; return the Turn to step the env with, or None if the episode ended here."""
        ep, cfg = lv.ep, self.cfg
        traj = ep.trajectory
        ids, lps = list(gen.token_ids), [float(x) for x in gen.logprobs]
        if len(lps) != len(ids):
            raise RuntimeError(f"engine returned {len(lps)} logprobs for {len(ids)} tokens")
        room = cfg.max_response_tokens - len(ep.response_ids)
        cut = len(ids) > room
        if cut:
            ids, lps = ids[:room], lps[:room]
        text = gen.text if not cut else self.tokenizer.decode(ids, skip_special_tokens=True)
        start = len(ep.response_ids)
        ep.response_ids.extend(ids)
        ep.response_mask.extend([1] * len(ids))
        ep.logprobs.extend(lps)
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
            _finish(lv, "truncated")
            return None
        if not text.strip():
            _finish(lv, "invalid", "the model produced an empty reply")
            return None
        return tr

    def _take_step(self, lv: _Live, tr: Turn, status: CallStatus, value: Any, turn: int) -> None:
        ep, cfg = lv.ep, self.cfg
        traj = ep.trajectory
        if status is CallStatus.TIMEOUT:
            _finish(lv, "env_error", f"env.step timed out after {cfg.env_timeout_s:g}s (turn {turn})")
            return
        if status is CallStatus.ERROR:
            _finish(lv, "env_error", f"env.step failed (turn {turn}): {_describe(value)}")
            return
        if not isinstance(value, StepResult) or not isinstance(value.observation, str):
            _finish(lv, "env_error", f"env.step returned {value!r:.200}, not a StepResult with a str observation")
            return
        try:
            reward = float(value.reward)
        except (TypeError, ValueError):
            _finish(lv, "env_error", f"env.step returned a non-numeric reward {value.reward!r:.100}")
            return
        tr.observation, tr.reward, tr.done = value.observation, reward, bool(value.done)
        tr.info = {**dict(value.info or {}), **tr.info}
        if "success" in (value.info or {}):
            traj.success = bool(value.info["success"])
        if tr.done:
            _finish(lv, "done")
            return
        if turn + 1 >= cfg.max_turns:
            return  # the loop ends it as max_turns; no observation tokens after the last reply
        obs_ids, obs_cut = self._obs_tokens(value.observation)
        delta = self.chat.obs_ids(obs_ids, lv.generation)
        if obs_cut:
            ep.truncated = True
            traj.info["obs_truncated"] = traj.info.get("obs_truncated", 0) + 1
        if len(ep.response_ids) + len(delta) >= cfg.max_response_tokens:
            # The observation and at least one reply token would not fit.
            _finish(lv, "truncated")
            return
        ep.response_ids.extend(delta)
        ep.response_mask.extend([0] * len(delta))
        ep.logprobs.extend([0.0] * len(delta))
        lv.obs = value.observation

    def _close_all(self, pool: EnvCallPool, lives: Sequence[_Live]) -> None:
        with_env = [lv for lv in lives if lv.env is not None]
        results = pool.collect([pool.submit(lv.env.close) for lv in with_env], min(self.cfg.env_timeout_s, 10.0))
        for lv, (status, value) in zip(with_env, results):
            if status is not CallStatus.OK:
                lv.ep.trajectory.info["close_error"] = "timed out" if status is CallStatus.TIMEOUT else _describe(value)


# ------------------------------------------------------------------------------------------------- batch
def build_batch(episodes: Sequence[Episode], breakdowns: Sequence[Any] | None, allocator: Callable[..., Any],
                pad_token_id: int, keep_env_errors: bool = False):
    """Stack episodes into a :class:`~openmanus_rl_core.batch.Batch` for the trainer.

    Shapes (``B`` episodes, ``P`` longest prompt, ``R`` longest response, at least 1):

    - ``prompts`` [B, P] left-padded, ``responses`` [B, R] right-padded, ``input_ids`` = cat [B, P+R] (long);
    - ``attention_mask`` [B, P+R] (1 on real tokens), ``position_ids`` = clamp(cumsum(attention_mask) - 1, 0);
    - ``response_mask`` [B, R] float: 1 on generated tokens; all 0 for ``env_error`` episodes unless
      ``keep_env_errors``;
    - ``valid`` [B] bool: False for those excluded ``env_error`` episodes, which leave the advantage estimators'
      group statistics too (not only the loss);
    - ``rollout_log_probs`` [B, R] float: the engine's log-probs (0 off the mask);
    - ``token_level_scores`` [B, R] float: ``allocator(total, turn_rewards, segments, response_length)``;
    - ``step_ids`` [B, R] long: the turn index on each turn's reply tokens, -1 elsewhere.

    non_tensors: ``group_ids``, ``uid`` (unique per sample), ``anchor_obs`` (per sample: the observation each turn
    acted on), ``step_rewards`` (per sample: ``breakdown.turn_rewards``), ``success``, ``termination``,
    ``num_turns``, ``task_id``, ``reward`` (composed total), ``reward_parts``. ``breakdowns=None``: the env's own
    rewards (total = sum of step rewards, turn rewards = step rewards).
    """
    import torch

    from openmanus_rl_core.batch import Batch

    B = len(episodes)
    if B == 0:
        raise ValueError("build_batch got no episodes")
    if breakdowns is not None and len(breakdowns) != B:
        raise ValueError(f"build_batch got {len(breakdowns)} reward breakdowns for {B} episodes")
    P = max(1, max(len(e.prompt_ids) for e in episodes))
    R = max(1, max(len(e.response_ids) for e in episodes))
    prompts = torch.full((B, P), int(pad_token_id), dtype=torch.long)
    responses = torch.full((B, R), int(pad_token_id), dtype=torch.long)
    prompt_attn = torch.zeros((B, P), dtype=torch.long)
    resp_attn = torch.zeros((B, R), dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.float32)
    logp = torch.zeros((B, R), dtype=torch.float32)
    scores = torch.zeros((B, R), dtype=torch.float32)
    step_ids = torch.full((B, R), -1, dtype=torch.long)
    valid = torch.ones(B, dtype=torch.bool)
    totals, parts, step_rewards = [], [], []
    for i, ep in enumerate(episodes):
        traj = ep.trajectory
        p, r = len(ep.prompt_ids), len(ep.response_ids)
        valid[i] = traj.termination != "env_error" or keep_env_errors
        if p:
            prompts[i, P - p:] = torch.as_tensor(ep.prompt_ids, dtype=torch.long)
            prompt_attn[i, P - p:] = 1
        if r:
            responses[i, :r] = torch.as_tensor(ep.response_ids, dtype=torch.long)
            resp_attn[i, :r] = 1
            logp[i, :r] = torch.as_tensor(ep.logprobs, dtype=torch.float32)
            if valid[i]:
                mask[i, :r] = torch.as_tensor(ep.response_mask, dtype=torch.float32)
            step_ids[i, :r] = torch.as_tensor(ep.step_ids, dtype=torch.long)
        if breakdowns is not None:
            bd = breakdowns[i]
            total, turn_rewards, part = float(bd.total), [float(x) for x in bd.turn_rewards], dict(bd.parts)
        else:
            total, turn_rewards, part = traj.env_reward, [float(t.reward) for t in traj.turns], {}
        alloc = list(allocator(total, turn_rewards, traj.segments, r)) if r else []
        if len(alloc) != r:
            raise ValueError(f"allocator returned {len(alloc)} values for a response of {r} tokens")
        if r:
            scores[i, :r] = torch.as_tensor(alloc, dtype=torch.float32)
        totals.append(total)
        parts.append(part)
        step_rewards.append(turn_rewards)
    attention_mask = torch.cat([prompt_attn, resp_attn], dim=1)
    position_ids = (attention_mask.cumsum(-1) - 1).clamp_min(0)
    tensors = {
        "prompts": prompts,
        "responses": responses,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "response_mask": mask,
        "rollout_log_probs": logp,
        "token_level_scores": scores,
        "step_ids": step_ids,
        "valid": valid,
    }
    non_tensors = {
        "group_ids": [e.group_id for e in episodes],
        "uid": [e.uid for e in episodes],
        "anchor_obs": [list(e.anchor_obs) for e in episodes],
        "step_rewards": step_rewards,
        "success": [bool(e.trajectory.success) for e in episodes],
        "termination": [e.trajectory.termination for e in episodes],
        "num_turns": [e.trajectory.num_turns for e in episodes],
        "task_id": [e.trajectory.task_id for e in episodes],
        "reward": totals,
        "reward_parts": parts,
    }
    return Batch(tensors=tensors, non_tensors=non_tensors, meta={"pad_token_id": int(pad_token_id)})


# ----------------------------------------------------------------------------------------------- metrics
def rollout_metrics(episodes: Sequence[Episode], elapsed_s: float | None = None) -> dict[str, float]:
    """Scalars over a rollout: ``rollout/success_rate``, ``rollout/turns/mean``, ``rollout/termination/<reason>``
    (counts), ``rollout/response_length/{mean,max}``, ``rollout/agent_tokens/mean``, ``rollout/truncated``
    (fraction), ``rollout/env_reward/mean`` and throughput (``rollout/episodes_per_s``, ``rollout/turns_per_s``,
    ``rollout/tokens_per_s`` over generated tokens) when the elapsed time is known (``elapsed_s`` or the
    ``rollout_time_s`` the loop stores in each trajectory's info).
    """
    n = len(episodes)
    if n == 0:
        return {}
    trajs = [e.trajectory for e in episodes]
    turns = sum(t.num_turns for t in trajs)
    agent_tokens = sum(sum(e.response_mask) for e in episodes)
    out: dict[str, float] = {
        "rollout/episodes": float(n),
        "rollout/success_rate": sum(bool(t.success) for t in trajs) / n,
        "rollout/turns/mean": turns / n,
        "rollout/response_length/mean": sum(len(e.response_ids) for e in episodes) / n,
        "rollout/response_length/max": float(max(len(e.response_ids) for e in episodes)),
        "rollout/prompt_length/mean": sum(len(e.prompt_ids) for e in episodes) / n,
        "rollout/agent_tokens/mean": agent_tokens / n,
        "rollout/truncated": sum(e.truncated for e in episodes) / n,
        "rollout/env_reward/mean": sum(t.env_reward for t in trajs) / n,
    }
    counts = Counter(t.termination for t in trajs)
    for reason in TERMINATIONS:
        out[f"rollout/termination/{reason}"] = float(counts.get(reason, 0))
    for reason, c in counts.items():
        out[f"rollout/termination/{reason}"] = float(c)
    if elapsed_s is None:
        times = [t.info.get("rollout_time_s") for t in trajs if t.info.get("rollout_time_s")]
        elapsed_s = max(times) if times else None
    if elapsed_s:
        out["rollout/time_s"] = float(elapsed_s)
        out["rollout/episodes_per_s"] = n / elapsed_s
        out["rollout/turns_per_s"] = turns / elapsed_s
        out["rollout/tokens_per_s"] = agent_tokens / elapsed_s
    return out


# ----------------------------------------------------------------------------------------------- corpus
def tokenizer_corpus(env_factory: Callable[[], Any], template: Any, tasks: Sequence[Mapping[str, Any]],
                     max_turns: int = 8) -> list[str]:
    """Texts for training the tiny default's tokenizer: what the model will read and write.

    For each task: the system prompt, the first observation, and, when the env has ``oracle_action`` (an
    ``OracleEnv``), the oracle episode's rendered replies (``template.render``) and observations. A task whose
    episode fails is skipped (the corpus is best effort), but an env that cannot be built fails at once (its
    factory would fail for every task: a server that cannot start must not be started once per task), and so does
    a corpus where every task failed (:class:`~openmanus_rl_core.envs.EnvUnavailableError`, naming the first error).
    """
    from openmanus_rl_core.envs import EnvUnavailableError

    texts: list[str] = []
    started, first_error = 0, None
    for task in tasks:
        env = env_factory()
        try:
            system = template.system_prompt(str(getattr(env, "instruction", "") or ""))
            texts += [system, start_task(env, task)]
            started += 1
            if not hasattr(env, "oracle_action"):
                continue
            for _ in range(max_turns):
                action = env.oracle_action()
                texts.append(template.render(action))
                res = env.step(action)
                texts.append(res.observation)
                if res.done:
                    break
        except Exception as exc:  # noqa: BLE001  (best effort: a failing task adds nothing more)
            first_error = first_error or exc
        finally:
            try:
                env.close()
            except Exception:  # noqa: BLE001
                pass
    if tasks and not started:
        raise EnvUnavailableError(f"no tokenizer corpus: every one of {len(tasks)} tasks failed to start; the first "
                                  f"error: {_describe(first_error)}")
    return texts
