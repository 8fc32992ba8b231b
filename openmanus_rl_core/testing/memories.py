"""Checks of a memory (:class:`~openmanus_rl_core.protocols.Memory`): what context each turn sees."""

from __future__ import annotations

from typing import Any

from openmanus_rl_core.protocols import Memory, PastTurn, Summary, SummaryRequest

from .common import _fail, _built, hostile_texts


def check_memory(memory: Any, turns: int = 12) -> None:
    """Check a memory (an instance, or a class built with no arguments): ``per_turn`` is a bool; ``messages``
    returns a chat (role/content str dicts) that opens with the system prompt, shows the task, ends with a user
    message holding the current observation, is the same for the same input and leaves the history untouched;
    hostile texts never make it raise. A memory with a model-written summary (``summary_tokens`` > 0) is also checked
    by :func:`check_summary_members`."""
    memory = _built(memory, "check_memory")
    if not isinstance(memory, Memory) or not isinstance(memory.per_turn, bool):
        _fail(type(memory).__name__, "does not implement Memory (a bool per_turn, messages(system, task, history))")
    hostile = hostile_texts(2 * turns, seed=1)
    history = [PastTurn(reply=f"reply {k} " + hostile[2 * k][:200], action=f"act {k}",
                        observation=f"observation {k} " + hostile[2 * k + 1][:200]) for k in range(turns)]
    before = [(t.reply, t.action, t.observation) for t in history]
    for k in range(turns + 1):
        where = f"messages(system, task, history of {k} turns)"
        try:
            out = memory.messages("SYSTEM PROMPT", "THE TASK", history[:k])
        except Exception as exc:  # the loop calls it every turn: it must not raise
            _fail(where, f"raised {type(exc).__name__}: {exc}")
        if not isinstance(out, list) or not out or not all(
                isinstance(m, dict) and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str) for m in out):
            _fail(where, f"must return a non-empty list of {{'role': system|user|assistant, 'content': str}}, "
                         f"got {out!r:.300}")
        if out[0] != {"role": "system", "content": "SYSTEM PROMPT"}:
            _fail(where, f"must open with the system prompt as given, got {out[0]!r:.200}")
        if not any("THE TASK" in m["content"] for m in out if m["role"] == "user"):
            _fail(where, "does not show the task (the first observation) in any user message")
        current = history[k - 1].observation if k else "THE TASK"
        if out[-1]["role"] != "user" or current not in out[-1]["content"]:
            _fail(where, f"must end with a user message holding the current observation {current[:60]!r}")
        if memory.messages("SYSTEM PROMPT", "THE TASK", history[:k]) != out:
            _fail(where, "is not deterministic: the same input gave another chat")
    if [(t.reply, t.action, t.observation) for t in history] != before:
        _fail("messages(...)", "changed the history it was given")
    if getattr(memory, "summary_tokens", 0):
        check_summary_members(memory, history)


def check_summary_members(memory: Any, history: list[PastTurn]) -> None:
    """The optional summary members: ``summary_request`` asks for turns that exist and none twice, as a chat;
    ``messages(..., summary=...)`` shows the written summary; ``summary_fallback`` gives a str."""
    written = Summary()
    for k in range(len(history) + 1):
        where = f"summary_request(system, task, history of {k} turns, summary of {written.turns})"
        request = memory.summary_request("SYSTEM PROMPT", "THE TASK", history[:k], written)
        if request is None:
            continue
        if not isinstance(request, SummaryRequest) or not (written.turns < request.turns <= k):
            _fail(where, f"must return None or a SummaryRequest covering more turns than the summary does, at most "
                         f"the {k} there are; got {request!r:.200}")
        if not request.messages or not all(isinstance(m, dict) and isinstance(m.get("content"), str)
                                           for m in request.messages):
            _fail(where, f"the request's messages must be a chat of role/content dicts, got {request.messages!r:.200}")
        if memory.summary_request("SYSTEM PROMPT", "THE TASK", history[:k],
                                  Summary("SUMMARY", request.turns)) is not None:
            _fail(where, "asks again for turns a summary already covers")
        written = Summary("THE WRITTEN SUMMARY", request.turns)
        out = memory.messages("SYSTEM PROMPT", "THE TASK", history[:k], summary=written)
        if not any("THE WRITTEN SUMMARY" in m["content"] for m in out):
            _fail(f"messages(..., summary=...) after {k} turns", "does not show the written summary")
        if not isinstance(memory.summary_fallback(history[: request.turns]), str):
            _fail("summary_fallback(turns)", "must return a str")
    if written.turns == 0:
        _fail("summary_request", f"never asked for a summary over {len(history)} turns")
