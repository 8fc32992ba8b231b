"""``env=mix``: several envs in one run, each a *source* drawn by ratio.

.. code-block:: yaml

    # openmanus-rl train env=mix +env.kwargs.sources.key_door.ratio=3 \\
    #     +env.kwargs.sources.legs='{env: reasoning_gym, ratio: 1, kwargs: {dataset: leg_counting}}'
    env:
      name: mix
      kwargs:
        sources:
          key_door: {ratio: 3}                  # env option key_door (the source's name is the option's)
          legs:                                 # env option reasoning_gym, with kwargs over the option's own
            env: reasoning_gym
            ratio: 1
            kwargs: {dataset: leg_counting}

A source is an env *option* (``env/<option>.yaml``, as ``env=<option>`` would select it), composed alone, with the
source's ``kwargs`` merged over the option's and its ``max_turns``/``train_tasks``/``val_tasks``/``num_tasks`` (when
given) replacing the option's. The source's name labels its task rows (column ``source``) and its metrics
(``train/<source>/success_rate``, ``val/<source>/...``).

- **Tasks.** Each source's train and val rows are generated as ``env=<option>`` alone would generate them
  (:meth:`MixEnv.generate_splits`), then tagged with the source; the files hold every source's rows.
- **Draws.** Each step draws every source's share of the batch by ratio, from that source's own shuffled order
  (:class:`~openmanus_rl_core.data.sources.SourceSampler`); a resumed run continues every source where it was.
- **Episodes.** One env per episode, the task's source's (:meth:`MixEnv.start_task`), built only when an episode
  starts; the prompt shows that env's ``instruction``; an episode ends at its source's ``max_turns`` (``env.max_turns``
  of the mix is the longest any source may run, and bounds them all).
- **Oracles.** A source whose env has no ``oracle_action`` (TextArena's Blackjack-v0) gives no oracle episodes:
  its tasks are left out of the tokenizer corpus's played episodes and of the warm-up (one notice, listing
  :attr:`MixEnv.without_oracle`); the mix has an ``oracle_action`` while the task in play is a source's that has
  one (before any task: while any source has one), so ``hasattr(env, "oracle_action")`` means what it means for a
  single env.
- **Servers.** A source whose env has servers (``serve``) has them checked or started once, by the driver
  (:meth:`MixEnv.serve`), and stopped with the run.
- **Rewards.** A source with a ``reward`` (a reward option, ``reward/<option>.yaml``, as ``reward=<option>`` would
  select it, used as shipped: its interpolations read the run's config) has its episodes scored by that option's
  components alone, labelled ``<source>.<label>`` (``reward/legs.goal/mean``); the other sources' by the run's
  (``reward=``, and the Python rewards given to the API). Components see ``trajectory.task["source"]`` either way
  (:func:`source_rewards`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from types import SimpleNamespace
from typing import Any, Mapping

from openmanus_rl_core.protocols import StepResult

__all__ = ["MixEnv", "is_mix", "resolve_sources", "ratios", "source_rewards"]

SOURCE_KEYS = ("env", "ratio", "kwargs", "reward", "max_turns", "train_tasks", "val_tasks", "num_tasks")
_REPLACED = ("max_turns", "train_tasks", "val_tasks", "num_tasks")
_RESOLVED = "name"  # a resolved source names its env plugin; a source as the user writes it names an option (env)


def _check_source(name: str, spec: Any) -> None:
    if not isinstance(spec, Mapping):
        raise ValueError(f"sources.{name}={spec!r}: must be a mapping of {', '.join(SOURCE_KEYS)}")
    unknown = [k for k in spec if k not in SOURCE_KEYS]
    if unknown:
        raise ValueError(f"sources.{name}.{unknown[0]}: not a source setting (settings: {', '.join(SOURCE_KEYS)})")
    ratio = spec.get("ratio", 1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not math.isfinite(ratio) or ratio <= 0:
        raise ValueError(f"sources.{name}.ratio={ratio!r}: must be a positive number")
    if not isinstance(spec.get("kwargs") or {}, Mapping):
        raise ValueError(f"sources.{name}.kwargs={spec.get('kwargs')!r}: must be a mapping of the env's arguments")
    reward = spec.get("reward")
    if reward is not None and (not isinstance(reward, str) or not reward):
        raise ValueError(f"sources.{name}.reward={reward!r}: must name a reward option (as reward=<option> would)")


def resolve_sources(sources: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each source as its env is built: ``{name (plugin), kwargs, max_turns, train_tasks, val_tasks, num_tasks,
    ratio}``, and ``reward`` (its reward option) when it names one, composed from its env option (an already
    resolved source is kept)."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.config import ConfigError
    from openmanus_rl_core.config.loading import compose
    from openmanus_rl_core.plugin.registry import registry

    if not isinstance(sources, Mapping) or not sources:
        raise ConfigError(f"env.kwargs.sources={sources!r}: env=mix needs at least one source, e.g. "
                          f"+env.kwargs.sources.key_door.ratio=1")
    out: dict[str, dict[str, Any]] = {}
    for name, spec in sources.items():
        if isinstance(spec, Mapping) and _RESOLVED in spec:
            out[str(name)] = dict(spec)
            continue
        try:
            _check_source(str(name), spec)
        except ValueError as exc:
            raise ConfigError(f"env.kwargs.{exc}") from None
        option = str(spec.get("env", name))
        try:
            env = OmegaConf.to_container(compose([f"env={option}"]).env, resolve=True)
        except ConfigError as exc:
            raise ConfigError(f"env.kwargs.sources.{name}.env: {exc}") from None
        if is_mix(registry("env").get(env["name"])):
            raise ConfigError(f"env.kwargs.sources.{name}.env={option}: a source cannot be a mix itself")
        env["kwargs"] = OmegaConf.to_container(OmegaConf.merge(env.get("kwargs") or {}, spec.get("kwargs") or {}))
        env.update({k: spec[k] for k in _REPLACED if spec.get(k) is not None})
        out[str(name)] = {**env, "ratio": float(spec.get("ratio", 1))}
        if spec.get("reward"):
            try:
                _reward_option(str(spec["reward"]))
            except ConfigError as exc:
                raise ConfigError(f"env.kwargs.sources.{name}.reward: {exc}") from None
            out[str(name)]["reward"] = str(spec["reward"])
    return out


@functools.lru_cache(maxsize=None)
def _reward_option(option: str) -> dict:
    """The components of ``reward=<option>``, their interpolations unresolved, once the option has passed the checks
    the run's own ``reward=`` gets (every component found, its kwargs accepted, no value left to set: ``???``)."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.config.loading import check, compose

    cfg = compose([f"reward={option}"])
    check(cfg, training=False)
    return OmegaConf.to_container(cfg.reward.components, resolve=False)


def source_rewards(cfg: Any) -> dict[str, dict]:
    """``{source: its reward components}`` for the sources of an ``env=mix`` run (``cfg``, the typed config) that
    name their own ``reward`` (``{}`` for any other env), resolved against ``cfg`` as the run's own ``reward=``
    would be: what :meth:`RewardComposer.from_config
    <openmanus_rl_core.rewards.composer.RewardComposer.from_config>` takes as ``by_source``."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.plugin.registry import registry

    if not is_mix(registry("env").get(cfg.env.name)):
        return {}
    options = {str(name): spec["reward"] for name, spec in cfg.env.kwargs["sources"].items() if spec.get("reward")}
    run = OmegaConf.structured(cfg) if options else None  # the config each option's interpolations read
    out = {}
    for name, option in options.items():  # checked with the settings (resolve_sources): an option's name here
        run.reward.components = _reward_option(option)
        out[name] = OmegaConf.to_container(run.reward.components, resolve=True)
    return out


@functools.lru_cache(maxsize=None)
def _oracle_of(key: str) -> bool:
    from openmanus_rl_core.plugin.registry import build

    import json

    env = build("env", json.loads(key))
    try:
        return hasattr(env, "oracle_action")
    finally:
        env.close()


def _has_oracle(spec: Mapping[str, Any], factory: Any) -> bool:
    """Whether a source's env has an oracle: its plugin has none, or one env of it is asked (an env may offer
    ``oracle_action`` for some settings only: TextArena's for the games it can solve); once per process."""
    import json

    if not hasattr(factory, "oracle_action"):
        return False
    return _oracle_of(json.dumps({"name": spec["name"], "kwargs": spec.get("kwargs") or {}}, sort_keys=True,
                                 default=str))


def is_mix(factory: Any) -> bool:
    """Whether an env plugin (a class, or a function that builds an env) is ``env=mix``."""
    return isinstance(factory, type) and issubclass(factory, MixEnv)


def ratios(sources: Mapping[str, Any]) -> dict[str, float]:
    """Each source's ratio, in the order the sources are listed."""
    return {str(name): float(spec.get("ratio", 1)) for name, spec in sources.items()}


class MixEnv:
    """The env of one episode of a mix: the task's source's env, built when the episode starts (module docstring).

    Built with resolved sources (what :meth:`serve` hands back) or with sources as written (resolved here)."""

    @dataclasses.dataclass
    class Kwargs:
        """``env.kwargs`` of ``env=mix``, checked with the config: each source's settings and ratio."""

        sources: dict = dataclasses.field(default_factory=dict)

        def __post_init__(self) -> None:
            from openmanus_rl_core.config.plugin_kwargs import check_kwargs
            from openmanus_rl_core.plugin.registry import registry

            # each source's settings, ratio, env option and the env's own kwargs, before anything is built
            for name, spec in resolve_sources(self.sources).items():
                check_kwargs(f"env.kwargs.sources.{name}.kwargs", f"env {spec['name']!r}",
                             registry("env").get(spec["name"]), spec["kwargs"])

    def __init__(self, sources: Mapping[str, Any]):
        from openmanus_rl_core.plugin.registry import registry

        self.sources = resolve_sources(sources)
        self._factories = {name: registry("env").get(spec["name"]) for name, spec in self.sources.items()}
        self._env: Any = None
        self._source: str | None = None
        self._turns = 0

    @property
    def without_oracle(self) -> list[str]:
        """The sources whose env has no oracle, in listed order."""
        return [name for name, spec in self.sources.items() if not _has_oracle(spec, self._factories[name])]

    @property
    def oracle_action(self) -> Any:
        """The oracle of the task in play's source; before a task, present while any source has one (an
        ``AttributeError`` otherwise, so ``hasattr`` tells, as for a single env)."""
        if self._env is None:
            if len(self.without_oracle) == len(self.sources):
                raise AttributeError("no source of this mix has an oracle")
            return self._oracle_action
        if not hasattr(self._env, "oracle_action"):
            raise AttributeError(f"source {self._source!r} of this mix has no oracle")
        return self._oracle_action

    @property
    def instruction(self) -> str:
        """The instruction of the env playing the current task ("" before an episode starts)."""
        return str(getattr(self._env, "instruction", "") or "") if self._env is not None else ""

    @property
    def tools(self) -> list[dict] | None:
        """The tools of the env playing the current task (None before an episode starts, or for an env without)."""
        return getattr(self._env, "tools", None) if self._env is not None else None

    def action_choices(self) -> list[str] | None:
        """The legal actions of the env playing the current task (``rollout.constrain_actions``), None where it names
        none."""
        method = getattr(self._env, "action_choices", None) if self._env is not None else None
        return method() if method is not None else None

    @property
    def source(self) -> str | None:
        return self._source

    def start_task(self, task: Mapping[str, Any]) -> str:
        """Build the env of ``task["source"]`` and start the task on it (by content or by id, as any env)."""
        from openmanus_rl_core.plugin.registry import build
        from openmanus_rl_core.rollout.tasks import start_task

        source = task.get("source")
        if source not in self.sources:
            raise ValueError(f"task {task.get('task_id')!r} has source={source!r}, not one of this mix's sources "
                             f"({', '.join(self.sources)}); generate the mix's task files with env=mix")
        self.close()
        self._source, self._turns = str(source), 0
        self._env = build("env", self.sources[self._source])
        return start_task(self._env, task)

    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        raise ValueError("env=mix starts a task from its whole row (its source): call start_task(task)")

    def step(self, action: str) -> StepResult:
        if self._env is None:
            raise RuntimeError("env=mix: step() before start_task()")
        result = self._env.step(action)
        self._turns += 1
        limit = int(self.sources[self._source]["max_turns"])
        if not result.done and self._turns >= limit:  # the source's own turn limit, within the mix's longest
            info = {**(result.info or {}), "source_max_turns": limit}
            return StepResult(result.observation, result.reward, True, info)
        return result

    def _oracle_action(self) -> str:
        return self._env.oracle_action()

    def close(self) -> None:
        env, self._env = self._env, None
        if env is not None:
            env.close()

    # ------------------------------------------------------------------------------------- the driver's side
    @classmethod
    def serve(cls, sources: Mapping[str, Any], at_once: int | None = None) -> Any:
        """Resolve the sources once and open each one's env service (servers checked or started, each for up to
        ``at_once`` episodes: a step or a validation may hold one source's alone); the kwargs every mix env is
        then built with hold the resolved sources, each with its service's kwargs."""
        from openmanus_rl_core.plugin.envs import EnvService, open_env_service
        from openmanus_rl_core.plugin.registry import registry

        resolved = resolve_sources(sources)
        services: list[EnvService] = []
        try:
            for name, spec in resolved.items():
                service = open_env_service(f"{name} ({spec['name']})", registry("env").get(spec["name"]),
                                           spec["kwargs"], at_once=at_once)
                services.append(service)
                spec["kwargs"] = service.kwargs
        except BaseException:
            for service in services:
                service.close()
            raise

        def stop() -> None:
            for service in services:
                service.close()

        def check() -> None:
            for service in services:
                if service.check is not None:
                    service.check()

        return EnvService({"sources": resolved}, stop=stop, check=check)

    @staticmethod
    def generate_splits(kwargs: Mapping[str, Any], seed: int) -> tuple[list[dict], list[dict]]:
        """Every source's train and val rows, as ``env=<option>`` alone generates them, tagged with ``source``."""
        from openmanus_rl_core.data.generation import env_num_tasks, add_env_task_fields, generate_tasks

        train: list[dict] = []
        val: list[dict] = []
        for name, spec in resolve_sources(kwargs["sources"]).items():
            alone = SimpleNamespace(env=SimpleNamespace(**{k: spec.get(k) for k in ("name", "kwargs", *_REPLACED)}))
            rows = generate_tasks(spec["name"], spec["train_tasks"], spec["val_tasks"], seed, env_num_tasks(alone))
            add_env_task_fields(alone, *rows)
            for split, out in zip(rows, (train, val)):
                out.extend({**row, "source": name} for row in split)
        return train, val
