"""Checks of an action template (:class:`~openmanus_rl_core.protocols.ActionTemplate`)."""

from __future__ import annotations

from typing import Any, Sequence

from openmanus_rl_core.protocols import ActionTemplate, ParsedAction

from .common import _fail, _built, hostile_texts


def check_template(template: ActionTemplate | type[Any],
                   actions: Sequence[str] = ("look", "go north", "say apple")) -> None:
    """Check a template (an instance, or a class built with no arguments): a system prompt, stop strings, ``parse``
    never raises, ``render`` round-trips."""
    template = _built(template, "check_template")
    if not isinstance(template, ActionTemplate):
        _fail(type(template).__name__, "does not implement ActionTemplate (stop, system_prompt, parse, render)")
    if not isinstance(template.stop, list) or not all(isinstance(s, str) and s for s in template.stop):
        _fail("template.stop", f"must be a list of non-empty strings, got {template.stop!r}")
    prompt = template.system_prompt("Do the task.")
    if not isinstance(prompt, str) or "Do the task." not in prompt:
        _fail("system_prompt('Do the task.')", f"must return text containing the instruction, got {prompt!r}")
    for text in hostile_texts():
        try:
            parsed = template.parse(text)
        except Exception as exc:  # the contract says never raise
            _fail(f"parse({text[:40]!r})", f"raised {type(exc).__name__}: {exc}")
        if not isinstance(parsed, ParsedAction) or not isinstance(parsed.content, str) or not isinstance(parsed.valid, bool):
            _fail(f"parse({text[:40]!r})", f"must return ParsedAction with str content and bool valid, got {parsed!r}")
    for action in actions:
        reply = template.render(action)
        parsed = template.parse(reply)
        if not parsed.valid or parsed.content != action:
            _fail(f"parse(render({action!r}))", f"expected a valid action {action!r}, got {parsed!r}")
        for stop in template.stop:
            # a reply cut at the first stop string (as engines do) must still parse the same.
            if stop in reply:
                cut = reply[: reply.index(stop) + len(stop)]
                if template.parse(cut).content != action:
                    _fail(f"render({action!r}) cut at stop {stop!r}", f"parses as {template.parse(cut)!r}")
