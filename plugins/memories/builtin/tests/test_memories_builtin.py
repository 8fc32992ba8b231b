"""The built-in memories: full, window, summary."""

from __future__ import annotations

import pytest

from openmanus_rl_core.protocols import PastTurn
from openmanus_rl_core.plugin.registry import build
from openmanus_rl_core.testing import check_memory

TURNS = [PastTurn(reply=f"<action>a{k}</action>", action=f"a{k}", observation=f"o{k}\nmore") for k in range(5)]


def memory(name: str, **kwargs):
    return build("memory", {"name": name, "kwargs": kwargs})


@pytest.mark.parametrize("name, kwargs", [("full", {}), ("window", {"window": 2}),
                                          ("summary", {"window": 2, "max_chars": 40})])
def test_builtin_memories_pass_the_conformance_kit(name, kwargs):
    check_memory(memory(name, **kwargs))


def test_window_shows_the_task_and_the_last_k_turns():
    out = memory("window", window=2).messages("S", "T", TURNS)
    assert out == [{"role": "system", "content": "S"}, {"role": "user", "content": "T"},
                   {"role": "assistant", "content": "<action>a3</action>"}, {"role": "user", "content": "o3\nmore"},
                   {"role": "assistant", "content": "<action>a4</action>"}, {"role": "user", "content": "o4\nmore"}]
    assert memory("full").messages("S", "T", TURNS)[2]["content"] == "<action>a0</action>"
    assert memory("full").per_turn is False and memory("window", window=1).per_turn is True


def test_summary_lists_the_turns_before_the_window_newest_within_max_chars():
    # Lines "1. a0 -> o0" are 11 characters: the three turns before the window take 11 + 1 + 11 + 1 + 11 = 35.
    out = memory("summary", window=2, max_chars=35).messages("S", "T", TURNS)
    assert out[1] == {"role": "user", "content": "T\n\nEarlier turns:\n1. a0 -> o0\n2. a1 -> o1\n3. a2 -> o2"}
    assert [m["content"] for m in out[2:]] == ["<action>a3</action>", "o3\nmore", "<action>a4</action>", "o4\nmore"]
    assert memory("summary", window=5, max_chars=30).messages("S", "T", TURNS)[1]["content"] == "T"
    # One character less: the note of hidden turns (27 characters) and the newest line (11) would need 39.
    out = memory("summary", window=2, max_chars=34).messages("S", "T", TURNS)
    assert out[1]["content"] == "T\n\nEarlier turns:\n(3 earlier turns not shown)"


LINES = [f"{k + 1}. a{k} -> o{k}" for k in range(5)]  # 11 characters each


def _newest(n: int) -> list[str]:
    return LINES[len(LINES) - n:]


@pytest.mark.parametrize("max_chars, want", [
    (59, LINES), (70, LINES),  # 5 * 11 + 4 newlines = 59
    # The note of hidden turns (27 characters) and its newline count: 27 + 1 + 2 * 11 + 1 = 51.
    (58, ["(3 earlier turns not shown)", *_newest(2)]), (51, ["(3 earlier turns not shown)", *_newest(2)]),
    (50, ["(4 earlier turns not shown)", *_newest(1)]), (39, ["(4 earlier turns not shown)", *_newest(1)]),
    (38, ["(5 earlier turns not shown)"]), (27, ["(5 earlier turns not shown)"]),
    (26, []), (0, []),
])
def test_the_summary_never_exceeds_max_chars_with_its_note_and_joining_newlines_counted(max_chars, want):
    text = memory("summary", window=1, max_chars=max_chars).summary(TURNS)
    assert text == "\n".join(want) and len(text) <= max_chars


@pytest.mark.parametrize("kwargs, bad", [({"window": 0}, "window=0"), ({"window": "2"}, "window='2'")])
def test_a_bad_window_is_an_error_naming_it(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        memory("window", **kwargs)
