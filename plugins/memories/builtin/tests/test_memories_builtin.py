"""The built-in memories: full, window, summary."""

from __future__ import annotations

import pytest

from openmanus_rl_core.protocols import PastTurn
from openmanus_rl_core.registry import build
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
    # Lines "1. a0 -> o0" are 11 characters (+1 newline): 30 characters hold the newest two of the three.
    out = memory("summary", window=2, max_chars=30).messages("S", "T", TURNS)
    assert out[1] == {"role": "user", "content": "T\n\nEarlier turns:\n(1 earlier turns not shown)\n2. a1 -> o1\n3. a2 -> o2"}
    assert [m["content"] for m in out[2:]] == ["<action>a3</action>", "o3\nmore", "<action>a4</action>", "o4\nmore"]
    assert memory("summary", window=5, max_chars=30).messages("S", "T", TURNS)[1]["content"] == "T"


@pytest.mark.parametrize("kwargs, bad", [({"window": 0}, "window=0"), ({"window": "2"}, "window='2'")])
def test_a_bad_window_is_an_error_naming_it(kwargs, bad):
    with pytest.raises(ValueError, match=bad):
        memory("window", **kwargs)
