"""Reward components given as Python callables (``omrl.train(..., rewards={label: fn or (fn, weight)})``, TRL's
``reward_funcs``), and how a run keeps them.

A callable cannot be saved with a run, so its name is: the run's ``config.json`` and each checkpoint's ``meta``
record every one as ``{label, weight, qualname, module}`` under :data:`RECORD_KEY`. Whatever scores the run again,
a resume or an evaluation, is given them again (``omrl.train(..., rewards=...)``, ``omrl.evaluate(...,
rewards=...)``). Without them it is refused in one line naming the missing labels, before anything starts, unless
``reward.missing_callables=drop``: then it goes on without them and says so. A resume that adds or drops one records
the change in ``config_history.jsonl``, like any other change of the run's settings.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from openmanus_rl_core.config import ConfigError

RECORD_KEY = "python_rewards"


class CallableReward:
    """A plain ``fn(trajectory) -> float`` (or a dict with ``score``) as a reward component."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn

    def compute(self, trajectory: Any) -> Any:
        return self.fn(trajectory)


def callable_specs(rewards: Mapping[str, Any] | None) -> list:
    """``{label: fn or (fn, weight)}`` as the composer's component specs."""
    from openmanus_rl_core.rewards.composer import ComponentSpec

    specs = []
    for label, value in (rewards or {}).items():
        fn, weight = value if isinstance(value, tuple) else (value, 1.0)
        if not callable(fn):
            raise ConfigError(f"rewards[{label!r}]={fn!r}: must be a callable fn(trajectory) -> float, or (fn, weight)")
        name = f"python:{getattr(fn, '__qualname__', type(fn).__name__)}"
        specs.append(ComponentSpec(str(label), name, weight, CallableReward(fn)))
    return specs


def record(specs: Sequence[Any]) -> list[dict]:
    """What a run keeps of its callable rewards: ``[{label, weight, qualname, module}]``."""
    out = []
    for s in specs:
        fn = s.component.fn
        out.append({"label": s.label, "weight": float(s.weight),
                    "qualname": getattr(fn, "__qualname__", type(fn).__qualname__),
                    "module": getattr(fn, "__module__", type(fn).__module__)})
    return out


def _names(recorded: Sequence[Mapping[str, Any]]) -> str:
    return ", ".join(f"{r['label']!r} ({r['module']}.{r['qualname']})" for r in recorded)


def take_again(recorded: Sequence[Mapping[str, Any]] | None, specs: Sequence[Any], policy: str, what: str,
               how: str, log: Callable[[str], None] = print) -> None:
    """Check that ``specs`` (the callables given now) hold every label of the run's ``recorded`` ones.

    ``what``: the command, in words (``the resume of <run>``); ``how``: how to give them again. A missing label
    is a :class:`~openmanus_rl_core.config.loading.ConfigError` naming it, or with ``policy == "drop"`` one line saying the
    command goes on without it."""
    given = {s.label for s in specs}
    missing = [r for r in recorded or () if r["label"] not in given]
    if not missing:
        return
    if policy != "drop":
        raise ConfigError(f"{what}: the run had reward(s) given as Python callables that were not given again: "
                          f"{_names(missing)}; {how}, or set reward.missing_callables=drop to go on without them")
    log(f"reward.missing_callables=drop: {what} goes on without the run's callable reward(s) {_names(missing)}")
