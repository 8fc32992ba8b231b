"""The reward composer: weighted reward components, with a per-component breakdown.

A reward config (``configs/reward/<option>.yaml``) names components by label::

    components:
      goal:           {name: goal, weight: 1.0, kwargs: {}}
      format:         {name: format, weight: 0.1}   # a well-formed reply as the run's template says
      invalid_action: {weight: 0.1}          # name defaults to the label, kwargs to {}

Each ``name`` is looked up in the ``reward`` registry (entry-point group ``openmanus_rl.rewards``). What
is registered there may be

- a :class:`~openmanus_rl_core.protocols.RewardComponent` class: built as ``cls(**kwargs)``;
- an object that already has a ``compute`` method: used as is (``kwargs`` must be empty);
- a plain function ``compute_score(solution_str, ground_truth, **kwargs) -> float | dict`` (the veRL /
  TRL scorer shape): wrapped in :class:`FunctionReward`.

A component may instead name a Python file and a function in it, no package needed (verl's
``custom_reward_function.path`` / ``.name``)::

      score: {path: /x/score.py, function: compute_score, weight: 1.0}   # function defaults to compute_score

The function is called as verl calls it, by keyword: ``compute_score(data_source=..., solution_str=...,
ground_truth=..., extra_info=...)`` (the task row's fields it names; see :class:`FunctionReward`).

For one trajectory with ``T`` turns the composer computes, per label ``l`` with weight ``w_l``::

    value_l  = component_l.compute(trajectory)            # float, or {"score": float, **extras}
    parts[l] = w_l * value_l
    total    = sum_l parts[l]
    turn_rewards[i] = sum_l w_l * v_l[i]                  # len T, sum == total

where ``v_l = component_l.compute_turns(trajectory)`` for components that have it (a process reward)
and ``v_l = [0, ..., 0, value_l]`` (all on the last turn) for the others. With zero turns
``turn_rewards == []`` and ``total`` is still the sum of the parts.

A component that raises, returns a non-number, or returns NaN/inf for one trajectory contributes 0 to
that trajectory; the failure is counted in ``reward/<label>/errors`` and its first message is logged
once per label. One bad sample never stops the batch.

Batched components: in :meth:`RewardComposer.compose_batch`, a component with a
``compute_batch(trajectories) -> list`` method (e.g. a reward model scoring many texts per forward pass) is
called once for the whole batch instead of ``compute`` per trajectory. Each returned value is then checked per
sample exactly as ``compute``'s would be (a non-number, NaN, or an ``Exception`` instance in the list counts as
that sample's error). If ``compute_batch`` itself raises or returns the wrong number of values, the composer says
so once and falls back to ``compute`` per trajectory.
"""

from __future__ import annotations

import logging
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from openmanus_rl_core.protocols import Trajectory
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rewards.components import FunctionReward, _plain, build_component
from openmanus_rl_core.rewards.files import RewardFileError, load_reward_file

__all__ = ["RewardBreakdown", "RewardComposer", "ComponentSpec"]

log = logging.getLogger(__name__)

_SPEC_KEYS = ("name", "weight", "kwargs", "path", "function")
# Compute_turns may differ from compute by float rounding; beyond this (relative) the component is
# inconsistent and we say so once. Either way the residual lands on the last turn so the sums agree.
_TURN_SUM_RTOL = 1e-6


@dataclass
class RewardBreakdown:
    """The composed reward of one trajectory.

    - ``total``: ``sum(parts.values())``, the reward training uses.
    - ``parts``: label -> weighted contribution ``weight * value``.
    - ``turn_rewards``: one float per turn, ``sum(turn_rewards) == total`` (empty with zero turns).
    - ``extras``: ``"<label>/<key>"`` -> float, the extra numeric entries of components that returned a
      dict (``{"score": ..., "acc": ...}`` gives ``extras["<label>/acc"]``).
    - ``raw``: label -> unweighted value (0 for a failed component).
    - ``errors``: label -> error message, for the components that failed on this trajectory.
    """

    total: float
    parts: dict[str, float]
    turn_rewards: list[float]
    extras: dict[str, float] = field(default_factory=dict)
    raw: dict[str, float] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)


@dataclass
class ComponentSpec:
    """One configured component: its label, registry name, weight and the built object; ``source``: the ``env=mix``
    source whose own ``reward`` it belongs to (see :class:`RewardComposer`)."""

    label: str
    name: str
    weight: float
    component: Any
    kwargs: dict[str, Any] = field(default_factory=dict)
    source: str | None = None  # scores only the trajectories of this env=mix source (None: the run's components)


def _check_weight(label: str, weight: Any) -> float:
    if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
        raise ValueError(
            f"reward {label!r}: weight must be a finite number, got {weight!r} ({type(weight).__name__}). "
            f"Set components.{label}.weight to e.g. 1.0."
        )
    return float(weight)


def _to_score(label: str, value: Any) -> tuple[float, dict[str, float]]:
    """A component's result -> (finite score, numeric extras). Raises ValueError if unusable."""
    extras: dict[str, float] = {}
    if isinstance(value, Mapping):
        if "score" not in value:
            raise ValueError(f"returned a dict without a 'score' key (keys: {sorted(value)})")
        extras = {f"{label}/{k}": float(v) for k, v in value.items()
                  if k != "score" and isinstance(v, numbers.Real) and math.isfinite(float(v))}
        value = value["score"]
    if isinstance(value, bool):
        value = float(value)
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"returned {value!r} ({type(value).__name__}), not a number") from None
    if not math.isfinite(score):
        raise ValueError(f"returned a non-finite value {score!r}")
    return score, extras


# ------------------------------------------------------------------------------------------ composer
class RewardComposer:
    """Sums weighted reward components and reports each one's contribution.

    Build it with :meth:`from_config` (names looked up in the reward registry) or directly from
    :class:`ComponentSpec` objects. See the module docstring for the formulas.

    Sources (``env=mix``): a spec with a ``source`` scores only that source's trajectories
    (``trajectory.task["source"]``); the specs without one score every trajectory whose source has no specs of its
    own. A trajectory's breakdown holds only the labels that scored it, and each label's metrics are over those
    trajectories.
    """

    def __init__(self, specs: Sequence[ComponentSpec]):
        labels = [s.label for s in specs]
        dup = sorted({lab for lab in labels if labels.count(lab) > 1})
        if dup:
            raise ValueError(f"reward labels must be unique; repeated: {dup}")
        for s in specs:
            if not isinstance(s.label, str) or not s.label or "/" in s.label:
                raise ValueError(f"reward label must be a non-empty string without '/', got {s.label!r}")
            s.weight = _check_weight(s.label, s.weight)
            if not hasattr(s.component, "compute"):
                raise TypeError(f"reward {s.label!r}: {s.component!r} has no compute(trajectory) method")
        self.specs = list(specs)
        self._own = {s.source for s in self.specs if s.source is not None}  # sources scored by their own specs
        self._warned: set[str] = set()

    def _scores(self, spec: ComponentSpec, trajectory: Trajectory) -> bool:
        """Whether ``spec`` scores ``trajectory`` (see the class docstring on sources)."""
        if not self._own:
            return True
        source = (trajectory.task or {}).get("source")
        return spec.source == source if spec.source is not None else source not in self._own

    # -------------------------------------------------------------------------------- construction
    @classmethod
    def from_config(cls, components_cfg: Mapping[str, Any] | None, template: Any = None,
                    by_source: Mapping[str, Any] | None = None) -> "RewardComposer":
        """Build from ``{label: {name, weight, kwargs}}`` (``name`` defaults to the label, ``weight`` to
        1.0, ``kwargs`` to ``{}``). The whole reward group config ``{components: {...}}`` is accepted too.

        ``by_source``: ``{source: components}``, the ``env=mix`` sources with a reward of their own
        (:func:`~openmanus_rl_core.plugin.mix.source_rewards`): each source's components, labelled
        ``<source>.<label>``, score its trajectories instead of ``components_cfg``.

        ``template``: the run's :class:`~openmanus_rl_core.protocols.ActionTemplate`. A component that scores
        replies by the template's own rules has an optional ``use_template(template)`` method, called here once
        after the component is built (e.g. ``format`` takes the template's ``end_pattern``).

        Raises :class:`~openmanus_rl_core.plugin.registry.UnknownPluginError` for an unknown name and
        ``ValueError`` naming the label for a bad weight or an unknown key.
        """
        cfg = _plain(components_cfg)
        if cfg is None:
            cfg = {}
        if not isinstance(cfg, Mapping):
            raise TypeError(f"reward components must be a mapping label -> {{name, weight, kwargs}}, got {cfg!r}")
        if set(cfg) == {"components"} and _looks_like_group(cfg["components"]):
            cfg = cfg["components"] or {}
        specs: list[ComponentSpec] = []
        for label, spec in cfg.items():
            spec = _plain(spec)
            if spec is None:
                spec = {}
            if not isinstance(spec, Mapping):
                raise ValueError(
                    f"reward {label!r}: expected a mapping with keys {list(_SPEC_KEYS)}, got {spec!r}"
                )
            unknown = sorted(set(spec) - set(_SPEC_KEYS))
            if unknown:
                raise ValueError(
                    f"reward {label!r}: unknown key(s) {unknown}; allowed keys are {list(_SPEC_KEYS)} "
                    "(component options go under kwargs)"
                )
            weight = _check_weight(str(label), spec.get("weight", 1.0))
            kwargs = _plain(spec.get("kwargs")) or {}
            if not isinstance(kwargs, Mapping):
                raise ValueError(f"reward {label!r}: kwargs must be a mapping, got {kwargs!r}")
            if spec.get("path"):
                fn = load_reward_file(str(label), spec)
                name = f"{spec['path']}:{fn.__name__}"
                try:
                    component = FunctionReward(fn, **kwargs)
                except TypeError as exc:
                    raise RewardFileError(f"reward {label!r}: {spec['path']}: {exc}") from None
            else:
                name = spec.get("name") or str(label)
                obj = registry("reward").get(name)  # UnknownPluginError with close matches if not installed
                component = build_component(obj, kwargs, label=str(label), name=name)
            if template is not None and callable(getattr(component, "use_template", None)):
                component.use_template(template)
            specs.append(ComponentSpec(str(label), name, weight, component, dict(kwargs)))
        for source, components in (by_source or {}).items():
            specs += [replace(spec, label=f"{source}.{spec.label}", source=str(source))
                      for spec in cls.from_config(components, template=template).specs]
        return cls(specs)

    @property
    def labels(self) -> list[str]:
        return [s.label for s in self.specs]

    # ------------------------------------------------------------------------------------- compose
    def compose(self, trajectory: Trajectory, precomputed: Mapping[str, Any] | None = None) -> RewardBreakdown:
        """The weighted reward of one trajectory, with its per-label and per-turn breakdown.

        ``precomputed``: label -> that component's result for this trajectory, already computed (by its
        ``compute_batch``); those components' ``compute`` is not called again.
        """
        n = trajectory.num_turns
        parts: dict[str, float] = {}
        raw: dict[str, float] = {}
        extras: dict[str, float] = {}
        errors: dict[str, str] = {}
        turn_rewards = [0.0] * n
        for s in self.specs:
            if not self._scores(s, trajectory):
                continue
            try:
                if precomputed is not None and s.label in precomputed:
                    result = precomputed[s.label]
                    if isinstance(result, BaseException):  # compute_batch's way to fail one sample
                        raise result
                else:
                    result = s.component.compute(trajectory)
                value, ex = _to_score(s.label, result)
                per_turn = self._turn_values(s, trajectory, value) if n else []
            except Exception as exc:  # any failure of one component on one sample: 0 and counted
                msg = f"{type(exc).__name__}: {exc}"
                errors[s.label] = msg
                self._warn_once(s.label, f"reward {s.label!r} ({s.name}) failed on a trajectory "
                                         f"(task_id={trajectory.task_id}); it counts 0 there: {msg}")
                parts[s.label] = 0.0
                raw[s.label] = 0.0
                continue
            raw[s.label] = value
            parts[s.label] = s.weight * value
            extras.update(ex)
            for i, v in enumerate(per_turn):
                turn_rewards[i] += s.weight * v
        total = float(sum(parts.values()))
        return RewardBreakdown(total=total, parts=parts, turn_rewards=turn_rewards, extras=extras, raw=raw,
                               errors=errors)

    def _turn_values(self, s: ComponentSpec, trajectory: Trajectory, value: float) -> list[float]:
        """Unweighted per-turn values of one component, summing to ``value`` (len = num turns >= 1)."""
        n = trajectory.num_turns
        compute_turns = getattr(s.component, "compute_turns", None)
        if compute_turns is None:
            return [0.0] * (n - 1) + [value]
        vals = [float(v) for v in compute_turns(trajectory)]
        if len(vals) != n:
            raise ValueError(f"compute_turns returned {len(vals)} values for {n} turns")
        if not all(math.isfinite(v) for v in vals):
            raise ValueError(f"compute_turns returned a non-finite value: {vals}")
        residual = value - sum(vals)
        if abs(residual) > _TURN_SUM_RTOL * max(1.0, abs(value)):
            self._warn_once(
                f"{s.label}/turns",
                f"reward {s.label!r} ({s.name}): compute_turns sums to {sum(vals)!r} but compute gives "
                f"{value!r}; the difference is put on the last turn",
            )
        vals[-1] += residual  # keeps sum(turn values) == value exactly up to rounding
        return vals

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(message)

    def compose_batch(self, trajectories: Sequence[Trajectory]) -> tuple[list[RewardBreakdown], dict[str, float]]:
        """Compose every trajectory; metrics per label over the batch:

        - ``reward/<label>/mean``: mean weighted contribution (failed samples count 0);
        - ``reward/<label>/raw_mean``: mean unweighted value;
        - ``reward/<label>/errors``: how many samples the component failed on;
        - ``reward/<label>/<key>/mean``: mean of each extra metric a dict result carried (over the
          samples that carried it).
        """
        batched = self._batch_values(trajectories)
        breakdowns = [self.compose(t, batched[i]) for i, t in enumerate(trajectories)]
        return breakdowns, self.batch_metrics(breakdowns)

    def batch_metrics(self, breakdowns: Sequence[RewardBreakdown]) -> dict[str, float]:
        """The metrics :meth:`compose_batch` gives, of breakdowns composed earlier (in parts, say)."""
        metrics: dict[str, float] = {}
        for s in self.specs:
            lab = s.label
            scored = [b for b in breakdowns if lab in b.parts]  # all of them but with env=mix sources' own rewards
            if breakdowns and not scored:
                continue
            count = max(len(scored), 1)
            metrics[f"reward/{lab}/mean"] = sum(b.parts[lab] for b in scored) / count
            metrics[f"reward/{lab}/raw_mean"] = sum(b.raw[lab] for b in scored) / count
            metrics[f"reward/{lab}/errors"] = float(sum(lab in b.errors for b in scored))
        sums: dict[str, list[float]] = {}
        for b in breakdowns:
            for key, v in b.extras.items():
                sums.setdefault(key, []).append(v)
        for key, vs in sums.items():
            metrics[f"reward/{key}/mean"] = sum(vs) / len(vs)
        return metrics

    def _batch_values(self, trajectories: Sequence[Trajectory]) -> list[dict[str, Any]]:
        """Per trajectory, label -> result of the components that have ``compute_batch`` (one call each for the
        whole batch). A component whose ``compute_batch`` fails as a whole is left out (scored per sample)."""
        out: list[dict[str, Any]] = [{} for _ in trajectories]
        if not trajectories:
            return out
        for s in self.specs:
            batch_fn = getattr(s.component, "compute_batch", None)
            if not callable(batch_fn):
                continue
            mine = [i for i, t in enumerate(trajectories) if self._scores(s, t)]
            if not mine:
                continue
            try:
                values = list(batch_fn([trajectories[i] for i in mine]))
                if len(values) != len(mine):
                    raise ValueError(f"compute_batch returned {len(values)} values for {len(mine)} trajectories")
            except Exception as exc:  # the whole batch call failed: score one trajectory at a time instead
                self._warn_once(f"{s.label}/batch", f"reward {s.label!r} ({s.name}): compute_batch failed "
                                                    f"({type(exc).__name__}: {exc}); scoring one trajectory at a time")
                continue
            for i, v in zip(mine, values):
                out[i][s.label] = v
        return out

    def __repr__(self) -> str:
        inner = ", ".join(f"{s.label}={s.name}*{s.weight:g}" for s in self.specs)
        return f"RewardComposer({inner})"


def _looks_like_group(value: Any) -> bool:
    """True if ``value`` is a ``components`` mapping (label -> spec) rather than one component's spec."""
    if value is None:
        return True
    if not isinstance(value, Mapping):
        return False
    return not (set(value) & set(_SPEC_KEYS)) or all(isinstance(v, Mapping) or v is None for v in value.values())
