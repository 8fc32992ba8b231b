"""What a reward component may be, and building one from what its registry entry names: a
:class:`~openmanus_rl_core.protocols.RewardComponent` class, a ready-made object with ``compute``, or a plain
scorer function ``compute_score(solution_str, ground_truth, **kwargs)`` wrapped in :class:`FunctionReward`."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Mapping
from typing import Any, Callable

from openmanus_rl_core.protocols import Trajectory

__all__ = ["FunctionReward", "build_component"]


class FunctionReward:
    """Adapts a scorer function ``fn(solution_str, ground_truth, **kwargs) -> float | dict`` to a
    :class:`~openmanus_rl_core.protocols.RewardComponent`.

    Per trajectory it calls ``fn(solution_str=trajectory.final_response, ground_truth=gt, **kw)`` where

    - ``gt`` is ``task["ground_truth"]``, else ``task["reward_model"]["ground_truth"]`` (veRL's parquet
      layout), else ``None``;
    - ``kw`` is the task's other fields (``data_source``, ``extra_info``, ...) updated with the
      configured ``kwargs`` (config wins), plus ``trajectory=`` if ``fn`` has a parameter of that name.
      A function without ``**kwargs`` receives only the keywords it names.

    The result is returned unchanged (a float, or a dict with ``score`` plus extra metrics); the
    composer interprets it.
    """

    def __init__(self, fn: Callable[..., Any], **kwargs: Any):
        if not callable(fn):
            raise TypeError(f"FunctionReward needs a callable scorer, got {fn!r}")
        self.fn = fn
        self.kwargs = dict(kwargs)
        self.name = getattr(fn, "__qualname__", getattr(fn, "__name__", repr(fn)))
        try:
            params = inspect.signature(fn).parameters
        except (TypeError, ValueError):  # builtins without a signature: pass everything
            params = None
        if params is None:
            self._accepts_var_kw, self._named = True, set()
        else:
            self._accepts_var_kw = any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values())
            self._named = {
                n
                for n, p in params.items()
                if p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
            }
        missing = {"solution_str", "ground_truth"} - self._named
        if missing and not self._accepts_var_kw:
            raise TypeError(
                f"reward function {self.name} must accept the keyword arguments solution_str and "
                f"ground_truth (it lacks {sorted(missing)}): compute_score(solution_str, ground_truth, **kwargs)"
            )
        unknown = set(self.kwargs) - self._named
        if unknown and not self._accepts_var_kw:
            raise TypeError(
                f"reward function {self.name} takes no argument(s) {sorted(unknown)}; "
                f"its parameters are {sorted(self._named)}. Fix the reward's kwargs in the config."
            )

    @staticmethod
    def ground_truth(task: Mapping[str, Any]) -> Any:
        """``task["ground_truth"]``, else ``task["reward_model"]["ground_truth"]``, else None."""
        if task.get("ground_truth") is not None:
            return task["ground_truth"]
        rm = task.get("reward_model")
        if isinstance(rm, Mapping):
            return rm.get("ground_truth")
        return None

    def compute(self, trajectory: Trajectory) -> Any:
        task = dict(trajectory.task or {})
        kw: dict[str, Any] = {k: v for k, v in task.items() if k not in ("ground_truth", "solution_str")}
        kw.update(self.kwargs)
        kw["trajectory"] = trajectory
        if not self._accepts_var_kw:
            kw = {k: v for k, v in kw.items() if k in self._named}
        elif "trajectory" not in self._named:
            kw.pop("trajectory")  # only given to functions that ask for it by name
        return self.fn(solution_str=trajectory.final_response, ground_truth=self.ground_truth(task), **kw)

    def __repr__(self) -> str:
        return f"FunctionReward({self.name}, kwargs={self.kwargs!r})"


# ------------------------------------------------------------------------------------------ building
def _plain(obj: Any) -> Any:
    """OmegaConf containers and schema nodes -> plain dicts/lists (components should not see DictConfig)."""
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    try:
        from omegaconf import DictConfig, ListConfig, OmegaConf
    except ImportError:  # pragma: no cover - omegaconf is a core dependency
        return obj
    if isinstance(obj, (DictConfig, ListConfig)):
        return OmegaConf.to_container(obj, resolve=True)
    return obj


def _is_function_style(obj: Any) -> bool:
    """A registered reward is function-style if it is a plain callable that is neither a class nor an
    object with a ``compute`` method."""
    return not inspect.isclass(obj) and not hasattr(obj, "compute") and callable(obj)


def build_component(obj: Any, kwargs: Mapping[str, Any] | None = None, *, label: str = "?", name: str = "?") -> Any:
    """Turn what the registry returned into a component object (see the module docstring)."""
    kwargs = dict(kwargs or {})
    if inspect.isclass(obj):
        try:
            return obj(**kwargs)
        except TypeError as exc:
            raise TypeError(
                f"reward {label!r}: cannot build {name!r} ({obj.__module__}.{obj.__qualname__}) with "
                f"kwargs {sorted(kwargs)}: {exc}"
            ) from exc
    if hasattr(obj, "compute"):
        if kwargs:
            raise TypeError(
                f"reward {label!r}: {name!r} is registered as a ready-made component object, so it "
                f"takes no kwargs (got {sorted(kwargs)}); remove them from the config"
            )
        return obj
    if callable(obj):
        try:
            return FunctionReward(obj, **kwargs)
        except TypeError as exc:
            raise TypeError(f"reward {label!r}: {exc}") from exc
    raise TypeError(
        f"reward {label!r}: {name!r} is registered as {obj!r}, which is neither a RewardComponent class, "
        "an object with a compute() method, nor a compute_score(solution_str, ground_truth, **kw) function"
    )
