"""What every check of the kit shares: its error, hostile text, and the smallest training run."""

from __future__ import annotations

import inspect
import random
from typing import Any

SMALL_RUN = [
    "env=key_door", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
    "data.train_batch_size=4", "algorithm.n=4", "env.train_tasks=16", "env.val_tasks=4", "rollout.max_new_tokens=8",
    "warmup.steps=2", "warmup.batch_size=4", "warmup.validate=false", "trainer.val_before_train=false",
    "trainer.val_freq=0", "trainer.progress=false", "trainer.num_cpus=2", "trainer.total_steps=2",
]
"""Overrides of the smallest training run that exercises every phase (a one-layer 32-wide tiny model, 4 tasks x 4
samples, a 2-step warm-up, 2 RL steps, one validation at the end): for a plugin's end-to-end test."""


class ConformanceError(AssertionError):
    """A plugin broke the contract of :mod:`openmanus_rl_core.protocols`."""


def _fail(what: str, detail: str) -> None:
    raise ConformanceError(f"{what}: {detail}")


def _built(component: Any, check: str) -> Any:
    """``component`` itself, or, when it is a class, an instance built with no arguments: every ``check_*`` takes
    either. A class that needs arguments is refused by name (``check``: the calling check, for the message)."""
    if not isinstance(component, type):
        return component
    name = component.__name__
    try:
        inspect.signature(component).bind()
    except TypeError as exc:
        raise TypeError(f"{check}({name}): {name} cannot be built with no arguments ({exc}); pass an instance "
                        f"instead: {check}({name}(...))") from None
    except ValueError:  # no signature to read (a C type): building it tells
        pass
    return component()


_FIXED_HOSTILE = [
    "",
    " ",
    "\n\n\n",
    "\x00\x01\x02\x1b[31m",
    "<action></action>",
    "<action>unterminated",
    "</action><action>",
    "Action:",
    "Thought: \nAction:\n",
    '{"name": "act", "arguments": {"action": null}}',
    "{" * 200,
    "ünïcödé ✓ 漢字 🙂",
    "a" * 20_000,
    "look\r\nlook",
    "'; DROP TABLE envs; --",
    "${jndi:ldap://x}",
    "{{7*7}}",
]


def hostile_texts(n: int = 40, seed: int = 0) -> list[str]:
    """A fixed list of nasty strings plus ``n`` random ones from a seeded generator."""
    rng = random.Random(seed)
    alphabet = "abcdefghijklmnopqrstuvwxyz <>/{}[]\"':,.\n\t\\0123456789_-!?ÿ漢🙂\x00"
    out = list(_FIXED_HOSTILE)
    for _ in range(n):
        out.append("".join(rng.choice(alphabet) for _ in range(rng.randint(0, 300))))
    return out
