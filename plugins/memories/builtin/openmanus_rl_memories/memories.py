"""Built-in memories: what context the model sees at each turn (:class:`~openmanus_rl_core.protocols.Memory`).

=============  ==========================================================================  =================
name           the context before reply ``t``                                              training samples
=============  ==========================================================================  =================
``full``       system, task, then every reply and observation (token for token)            one per episode
``window``     system, task, then the last ``window`` turns (reply, observation)           one per turn
``summary``    system, task + a summary of the turns before the window, then the window    one per turn
=============  ==========================================================================  =================

``summary``'s writer (``memory.kwargs.writer``):

- ``rule`` (default): one line per turn ``<n>. <action> -> <the observation's first line>``, the newest lines kept
  within ``max_chars`` (older ones counted, not shown). No model call.
- ``policy``: the policy being trained (the rollout's engine) writes it; ``engine``: a separately configured engine
  (``engine: {name: openai, kwargs: {base_url, model, api_key_env}}``, any engine that needs no in-process model)
  writes it. Each time turns leave the window, the writer gets the previous summary and those turns
  (:data:`WRITER_SYSTEM` and :meth:`SummaryMemory.summary_request`) and answers in at most ``max_summary_tokens``
  tokens; the loop cuts a longer answer to that budget by tokens, keeps the rule summary instead of an empty or
  malformed answer, and never trains on the writing (``openmanus_rl_core/rollout/summaries.py``). One more
  generate call per turn, batched over the episodes about to reply.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Dict, Literal, Optional

from openmanus_rl_core.protocols import PastTurn, Summary, SummaryRequest

__all__ = ["FullMemory", "WindowMemory", "SummaryMemory", "chat", "WRITER_SYSTEM"]

WRITER_SYSTEM = ("You keep the record of an agent working on a task: a short summary of its earlier turns, holding "
                 "the facts it needs to go on.")


def chat(system: str, task: str, turns: Sequence[PastTurn]) -> list[dict[str, str]]:
    """``[system, user(task), assistant(reply_0), user(obs_0), ...]`` over ``turns``."""
    out = [{"role": "system", "content": system}, {"role": "user", "content": task}]
    for t in turns:
        out += [{"role": "assistant", "content": t.reply}, {"role": "user", "content": t.observation}]
    return out


def _window(window: int) -> int:
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window={window!r}: must be an int >= 1 (turns shown after the task)")
    return window


class FullMemory:
    """The whole episode; the loop concatenates its tokens itself (one sample per episode)."""

    per_turn = False

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        return chat(system, task, history)


class WindowMemory:
    """The task plus the last ``window`` turns (verl-agent's history window)."""

    per_turn = True

    def __init__(self, window: int):
        self.window = _window(window)

    def messages(self, system: str, task: str, history: Sequence[PastTurn]) -> list[dict[str, str]]:
        return chat(system, task, history[-self.window:])


class SummaryMemory:
    """The task with a summary of the turns before the window, then the last ``window`` turns (see the module doc
    for the writers)."""

    per_turn = True

    @dataclass
    class Kwargs:
        """``window``: turns shown verbatim; ``max_chars``: the rule summary's characters; ``writer``: who writes
        the summary; ``max_summary_tokens``: a model-written summary's budget (run's tokens); ``engine``: the
        writing engine's ``{name, kwargs}`` (writer=engine only)."""

        window: int
        max_chars: int
        writer: Literal["rule", "policy", "engine"] = "rule"
        max_summary_tokens: int = 128
        engine: Optional[Dict[str, Any]] = None

        def __post_init__(self) -> None:
            _window(self.window)
            for key, value, low in (("max_chars", self.max_chars, 0), ("max_summary_tokens", self.max_summary_tokens, 1)):
                if isinstance(value, bool) or not isinstance(value, int) or value < low:
                    raise ValueError(f"{key}={value!r}: must be an int >= {low}")
            if self.writer not in ("rule", "policy", "engine"):
                raise ValueError(f"writer={self.writer!r}: must be rule, policy or engine")
            if self.writer == "engine" and self.engine is None:
                raise ValueError("engine=null: writer=engine needs the writing engine, {name: <engine>, kwargs: "
                                 "{...}} (e.g. name: openai)")
            if self.writer != "engine" and self.engine is not None:
                raise ValueError(f"engine={self.engine}: only writer=engine reads it (writer={self.writer})")
            if self.engine is not None:
                _check_engine(self.engine)

    def __init__(self, window: int, max_chars: int, **kwargs: Any):
        k = self.Kwargs(window, max_chars, **kwargs)
        self.window, self.max_chars, self.writer = k.window, k.max_chars, k.writer
        self.engine_spec = k.engine
        self.summary_tokens = 0 if k.writer == "rule" else k.max_summary_tokens  # 0: the loop never asks
        self._engine: Any = None

    # ------------------------------------------------------------------------------------------- the rule
    def summary(self, turns: Sequence[PastTurn]) -> str:
        """One line per turn, the newest kept, the whole text (head line and joining newlines included) within
        ``max_chars``; ``""`` for no turns, or when not even the note of hidden turns fits."""
        lines = [f"{i + 1}. {t.action.strip() or '(no action)'} -> {(t.observation.strip().splitlines() or [''])[0]}"
                 for i, t in enumerate(turns)]
        kept: list[str] = []
        used = -1  # n lines joined by n - 1 newlines
        for line in reversed(lines):
            if used + 1 + len(line) > self.max_chars:
                break
            kept.append(line)
            used += 1 + len(line)
        while kept and len(lines) > len(kept):
            # The note of hidden turns counts too: give up the oldest shown lines until it fits.
            head = f"({len(lines) - len(kept)} earlier turns not shown)"
            if used + 1 + len(head) <= self.max_chars:
                break
            used -= 1 + len(kept.pop())
        hidden = len(lines) - len(kept)
        head = [f"({hidden} earlier turns not shown)"] if hidden else []
        text = "\n".join(head + kept[::-1])
        return text if len(text) <= self.max_chars else ""

    def messages(self, system: str, task: str, history: Sequence[PastTurn],
                 summary: Summary | None = None) -> list[dict[str, str]]:
        cut = max(0, len(history) - self.window)
        # A model-written summary when the loop has one (it covers the turns before the window), else the rule's.
        earlier = summary.text if summary is not None and self.summary_tokens else self.summary(history[:cut])
        shown = f"{task}\n\nEarlier turns:\n{earlier}" if earlier and cut else task
        return chat(system, shown, history[cut:])

    # ------------------------------------------------------------------------------ a model-written summary
    def summary_engine(self, tokenizer: Any) -> Any:
        """writer=engine: the writing engine, built once with the run's tokenizer; writer=policy: None."""
        if self.engine_spec is None:
            return None
        if self._engine is None:
            from openmanus_rl_core.plugin.registry import build

            runtime = {"tokenizer": tokenizer}
            if "settings_key" in _accepted(self.engine_spec["name"]):  # its messages then name memory.kwargs.engine
                runtime["settings_key"] = "memory.kwargs.engine.kwargs"
            self._engine = build("engine", self.engine_spec, **runtime)
        return self._engine

    def summary_request(self, system: str, task: str, history: Sequence[PastTurn],
                        summary: Summary) -> SummaryRequest | None:
        """The chat that adds the turns that left the window since ``summary`` was written; None when none did."""
        cut = max(0, len(history) - self.window)
        if not self.summary_tokens or cut <= summary.turns:
            return None
        turns = "\n".join(f"Turn {summary.turns + i + 1}: {t.action.strip() or '(no action)'}\n"
                          f"Observation: {t.observation.strip()}" for i, t in enumerate(history[summary.turns:cut]))
        user = (f"Task:\n{task}\n\nSummary so far:\n{summary.text or '(none yet)'}\n\nTurns to add:\n{turns}\n\n"
                f"Write the updated summary in at most {self.summary_tokens} tokens. Reply with the summary only.")
        return SummaryRequest(messages=[{"role": "system", "content": WRITER_SYSTEM},
                                        {"role": "user", "content": user}], turns=cut)

    def summary_fallback(self, turns: Sequence[PastTurn]) -> str:
        """Kept when the writer's answer is unusable: the rule summary of ``turns``."""
        return self.summary(turns)


def _accepted(engine: str) -> dict:
    from openmanus_rl_core.config.plugin_kwargs import accepted_kwargs
    from openmanus_rl_core.plugin.registry import registry

    return (accepted_kwargs(registry("engine").get(engine)) or ({}, False))[0]


def _check_engine(spec: Any) -> None:
    """writer=engine: a known engine that needs no in-process model, with kwargs it takes."""
    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.plugin_kwargs import check_kwargs
    from openmanus_rl_core.plugin.registry import registry

    if not isinstance(spec, Mapping) or not isinstance(spec.get("name"), str) or set(spec) - {"name", "kwargs"}:
        raise ValueError(f"engine={spec!r}: must be a mapping {{name: <engine>, kwargs: {{...}}}}")
    factory = registry("engine").get(spec["name"])
    if getattr(factory, "needs_model", True):
        raise ValueError(f"engine.name={spec['name']}: a summary engine must serve its own model (e.g. openai); "
                         f"for the policy itself set writer=policy")
    kwargs = spec.get("kwargs") or {}
    if not isinstance(kwargs, Mapping):
        raise ValueError(f"engine.kwargs={kwargs!r}: must be a mapping of the engine's arguments")
    try:
        check_kwargs("memory.kwargs.engine.kwargs", f"engine {spec['name']!r}", factory, kwargs)
    except ConfigError as exc:
        raise ValueError(str(exc)) from None
