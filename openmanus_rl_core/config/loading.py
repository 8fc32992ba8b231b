"""Hydra configuration: the typed schema, the core's config tree plus every folder plugins contribute, and the
check of the whole composed config before anything starts.

:class:`~openmanus_rl_core.config.schema.Config` (every key, type and default) is registered in Hydra's ConfigStore as
``schema``; ``configs/config.yaml`` composes on top of it and chooses the options (``algorithm/grpo.yaml`` ...);
plugins add group options (``env/<name>.yaml``, ``reward/<name>.yaml`` ...) through the
``openmanus_rl_config_dirs`` hook, so a freshly installed plugin is selectable with ``env=<name>``.

:func:`load` composes and checks: a bad value raises :class:`ConfigError`, one line naming the key, the value and
what is allowed (``openmanus-rl`` prints it and exits with status 2).
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import re
from pathlib import Path
from typing import Any, Sequence

from omegaconf import DictConfig, OmegaConf

from openmanus_rl_core.config.plugin_kwargs import check_env_run, check_plugin_kwargs
from openmanus_rl_core.plugin.manager import make_plugin_manager
from openmanus_rl_core.config.fields import ConfigError
from openmanus_rl_core.config.rules import RULES
from openmanus_rl_core.config.schema import Config


def core_config_dir() -> Path:
    """Folder of the core's own config tree (the repo's top-level ``configs/``, installed as a package)."""
    return Path(str(importlib.resources.files("openmanus_rl_core.configs")))


def plugin_config_dirs(pm=None) -> list[str]:
    """Search-path URLs contributed by installed plugins, in registration order, without duplicates."""
    pm = pm or make_plugin_manager()
    urls: list[str] = []
    for contributed in reversed(pm.hook.openmanus_rl_config_dirs()):  # pluggy calls last-registered first
        for d in contributed or []:
            url = d if "://" in str(d) else f"file://{Path(d).resolve()}"
            if url not in urls:
                urls.append(url)
    return urls


# Keys whose whole mapping, given as ``key={...}``, replaces the one composed (Hydra would merge it in, keeping the
# default entries): a mix's sources. ``+key.name={...}`` or ``key.name.field=...`` still add to or change one entry.
WHOLE_MAPPINGS = ("env.kwargs.sources",)


def whole_mappings(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with each ``key={...}`` of a :data:`WHOLE_MAPPINGS` key as Hydra's delete-then-add pair."""
    out: list[str] = []
    for o in overrides:
        key, eq, value = (part.strip() for part in o.partition("="))
        out += [f"~{key}", f"+{key}={value}"] if eq and key in WHOLE_MAPPINGS and value.startswith("{") else [o]
    return out


# Keys whose value is taken as written (:func:`literal_values`): a command line's own ``=``, ``,`` and quotes.
LITERAL_KEYS = ("agent.command",)


def literal_values(overrides: Sequence[str]) -> list[str]:
    """``overrides`` with the value of each :data:`LITERAL_KEYS` key quoted for Hydra, so that it arrives as written
    (``agent.command=python agent.py --mode=fast`` would otherwise be a grammar error, and ``a,b`` a sweep); a value
    already in Hydra's quotes, or ``null``, is left to Hydra."""
    out: list[str] = []
    for o in overrides:
        key, eq, value = o.partition("=")
        if eq and key.strip().lstrip("+") in LITERAL_KEYS and value.strip() != "null" and not _hydra_quoted(o):
            # Hydra's quoted strings: a backslash is escaped only before a quote or at the end
            escaped = re.sub(r"(\\*)('|$)", lambda m: m.group(1) * 2 + ("\\'" if m.group(2) else ""), value)
            o = f"{key}='{escaped}'"
        out.append(o)
    return out


def _hydra_quoted(override: str) -> bool:
    """Whether the override's value is one string in Hydra's own quotes (``key='a=b'``)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    if override.partition("=")[2].lstrip()[:1] not in ("'", '"'):
        return False
    try:
        return isinstance(OverridesParser.create().parse_override(override).value(), str)
    except Exception:  # Hydra's grammar error: not one quoted string
        return False


def agent_options(cfg: DictConfig, overrides: Sequence[str], choices: Any, config_name: str = "config"
                  ) -> dict[str, str]:
    """The options an agent run takes (``agent.reward_option``, ``agent.template_option``: the reward the agent
    posts, every reply its framework writes a valid action), for the groups that neither the command line names
    (``reward=``, ``reward.*=``) nor an option file changed from the primary config's choice (``choices()``: Hydra's
    choices of the composition; the primary config: ``<config_name>.yaml``'s defaults list). Empty when the run has
    no agent."""
    agent = cfg.agent
    if not (agent.command or agent.function):
        return {}
    named = {o.lstrip("+~").partition("=")[0].split(".")[0] for o in overrides if "=" in o}
    wanted = {"reward": agent.reward_option, "template": agent.template_option}
    left = {g: option for g, option in wanted.items() if option and g not in named}
    if not left:
        return {}
    import yaml

    primary = {k: v for d in yaml.safe_load((core_config_dir() / f"{config_name}.yaml").read_text())["defaults"]
               if isinstance(d, dict) for k, v in d.items()}
    chosen = choices()
    return {g: option for g, option in left.items() if chosen.get(g) == primary.get(g)}


def agent_options_line(options: dict[str, str]) -> str:
    """The one line that says what :func:`agent_options` chose."""
    why = {"reward": "the reward the agent posts", "template": "every reply a valid action, no format penalty"}
    chosen = ", ".join(f"{g}={o} ({why[g]})" for g, o in options.items())
    return (f"agent run: {chosen}; give {' or '.join(f'{g}=...' for g in options)} to choose otherwise (e.g. the "
            f"template your agent's replies are written in: the warm-up writes its demonstrations in it)")


def compose(overrides: Sequence[str] = (), config_name: str = "config", pm=None,
            log: Any = None) -> DictConfig:
    """Compose the config as ``openmanus-rl <command> key=value ...`` sees it (a :data:`WHOLE_MAPPINGS` key given
    a whole mapping is replaced by it; a :data:`LITERAL_KEYS` value taken as written; an agent run's reward and
    template options where nothing chose otherwise, told to ``log`` in one line)."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from hydra.core.config_store import ConfigStore

    ConfigStore.instance().store(name="schema", node=_schema_node())
    searchpath = plugin_config_dirs(pm)
    extra = [f"hydra.searchpath=[{','.join(searchpath)}]"] if searchpath else []
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(core_config_dir()), version_base="1.3", job_name="openmanus_rl"):
            given = whole_mappings(literal_values(overrides))
            cfg = hydra_compose(config_name=config_name, overrides=given + extra)
            more = ["model=pretrained"] if _needs_pretrained_recipe(cfg, overrides) else []
            agent = agent_options(cfg, overrides, lambda: hydra_compose(
                config_name=config_name, overrides=given + extra, return_hydra_config=True).hydra.runtime.choices,
                config_name)
            more += [f"{group}={option}" for group, option in agent.items()]
            if more:
                cfg = hydra_compose(config_name=config_name, overrides=[*given, *more, *extra])
            if agent and log is not None:
                log(agent_options_line(agent))
            return cfg
    except Exception as exc:
        raise _explain(exc, overrides) from None


def _needs_pretrained_recipe(cfg: DictConfig, overrides: Sequence[str]) -> bool:
    """A user's model (``model.path``) gets the pretrained recipe unless a ``model=`` option was chosen: the tiny
    model's learning rates and warm-up would wreck pretrained weights."""
    chosen = any(o.split("=", 1)[0].lstrip("+~") == "model" for o in overrides)
    return not chosen and "model" in cfg and cfg.model.get("path") is not None and cfg.model.get("recipe") == "tiny"


def _schema_node(node: DictConfig | None = None, schema: type = Config) -> DictConfig:
    """The schema as a typed node whose open mappings (``Dict[str, Any]``: plugin kwargs, reward components)
    accept new keys from the command line (``env.kwargs.size=3``) while every other node stays closed."""
    node = OmegaConf.structured(Config) if node is None else node
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            _schema_node(node[f.name], type(default))
        elif "Dict" in str(f.type):
            OmegaConf.set_struct(node._get_node(f.name), False)
    return node


def load(overrides: Sequence[str] = (), pm=None, training: bool = True) -> Config:
    """The composed, checked, typed config (raises :class:`ConfigError`)."""
    return check(compose(overrides, pm=pm), training=training)


def check(cfg: DictConfig | Config, training: bool = True) -> Config:
    """``cfg`` as a typed :class:`Config` with interpolations resolved, after the range checks, the component
    names and, for a training run (``training``), the cross-field rules of training."""
    if isinstance(cfg, Config):
        typed = cfg
    else:
        _check_known_keys(cfg, Config, "")
        try:
            typed = OmegaConf.to_object(cfg)
        except Exception as exc:
            raise _explain(exc, ()) from None
    _check_fields(typed, "")
    for rule in RULES if training else ():
        problem = rule(typed)
        if problem:
            raise ConfigError(problem)
    _check_components(typed)
    if training:
        check_env_run(typed)  # the env's own rules across sections (plugin_kwargs.py)
    return typed


def _check_components(c: Config) -> None:
    """Every component name resolves in its registry (metadata only, nothing imported); an unknown one raises
    :class:`~openmanus_rl_core.plugin.registry.UnknownPluginError` with close matches."""
    from openmanus_rl_core.plugin.registry import registry

    names = [("env", c.env.name), ("template", c.template.name), ("allocator", c.allocator.name),
             ("advantage", c.algorithm.adv_estimator), ("loss", c.algorithm.policy_loss), ("engine", c.rollout.engine),
             ("memory", c.memory.name)]
    for label, spec in c.reward.components.items():
        if (spec or {}).get("path"):  # a scorer in a Python file: checked without running it
            from openmanus_rl_core.rewards.files import check_reward_file

            check_reward_file(str(label), spec)
        else:
            names.append(("reward", (spec or {}).get("name") or label))
    for kind, name in names:
        registry(kind).resolve(name)
    _check_loggers(c.trainer.loggers)
    check_plugin_kwargs(c)  # the plugins' own settings, against their signatures (plugin_kwargs.py)


def _check_loggers(loggers: Sequence[str]) -> None:
    """Every ``trainer.loggers`` name is an installed hook plugin (a tracker registers its hooks under it)."""
    from openmanus_rl_core.plugin.manager import hook_entries

    known = sorted({e.name for e in hook_entries()})
    for name in loggers:
        if name not in known:
            close = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]}? " if close else ""
            raise ConfigError(f"trainer.loggers: {name!r} is not installed; {hint}a tracker is a plugin "
                              f"distribution (make install installs plugins/trackers/*); installed hook plugins: "
                              f"{', '.join(known)}")


def _check_known_keys(node: Any, schema: type, prefix: str) -> None:
    """A key the schema does not have (added with ``+key=value``) is an error, answered with close matches."""
    fields = {f.name: f for f in dataclasses.fields(schema)}
    for key in node.keys():
        if key not in fields:
            raise ConfigError(_unknown(f"{prefix}{key}", None, list(fields)))
        sub = fields[key].default_factory() if fields[key].default_factory is not dataclasses.MISSING else None
        child = node._get_node(key)
        if dataclasses.is_dataclass(sub) and isinstance(child, DictConfig):
            _check_known_keys(child, type(sub), f"{prefix}{key}.")


def _unknown(key: str, given: str | None, known: Sequence[str], rest: str = "", value: str | None = None) -> str:
    """``key`` is not in the schema (``rest``: the part of the override below it, e.g. ``.lr`` of ``actr.lr``)."""
    parent, _, leaf = key.rpartition(".")
    full = [f"{parent}.{k}" if parent else k for k in known]
    close = difflib.get_close_matches(leaf, list(known), n=3, cutoff=0.6)
    hint = (f"did you mean {' or '.join((f'{parent}.{c}' if parent else c) + rest for c in close)}?" if close
            else f"known keys: {', '.join(full)}")
    value = given if value is None else value
    return f"{key}{rest}{'' if value is None else '=' + value}: unknown key; {hint}"


def _check_fields(node: Any, prefix: str) -> None:
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            _check_fields(value, key + ".")
            continue
        if value is None:
            continue
        meta = f.metadata
        if meta.get("choices") is not None:
            # A YAML/CLI `true` reaches a string field as "True": choices match regardless of case.
            match = [c for c in meta["choices"] if str(c).lower() == str(value).lower()]
            if not match:
                raise ConfigError(f"{key}={value}: allowed values are {', '.join(map(str, meta['choices']))}")
            setattr(node, f.name, match[0])
            continue
        if meta.get("ge") is not None and not value >= meta["ge"]:
            raise ConfigError(f"{key}={value}: must be >= {meta['ge']:g}")
        if meta.get("gt") is not None and not value > meta["gt"]:
            raise ConfigError(f"{key}={value}: must be > {meta['gt']:g}")


def schema_keys(node: Any = Config, prefix: str = "") -> list[str]:
    """Every dotted key of the schema (open mappings count as one key)."""
    out: list[str] = []
    for f in dataclasses.fields(node):
        sub = f.default_factory() if f.default_factory is not dataclasses.MISSING else None  # type: ignore[misc]
        if dataclasses.is_dataclass(sub):
            out += schema_keys(type(sub), f"{prefix}{f.name}.")
        else:
            out.append(f"{prefix}{f.name}")
    return out


def _expected(key: str) -> str | None:
    """What the schema field at ``key`` takes, in words (None for an unknown key)."""
    node: Any = Config
    for part in key.split("."):
        found = {f.name: f for f in dataclasses.fields(node)}.get(part)
        if found is None:
            return None
        if found.default_factory is not dataclasses.MISSING and dataclasses.is_dataclass(found.default_factory()):
            node = type(found.default_factory())
            continue
        kind = str(found.type)
        words = next((w for t, w in (("List", "a list"), ("Dict", "a mapping"), ("bool", "true or false"),
                                     ("int", "an integer"), ("float", "a number"), ("str", "a string"))
                      if t in kind), None)
        return f"{words} or null" if words and "Optional" in kind else words
    return None


def _override_value(overrides: Sequence[str], key: str) -> str | None:
    for o in overrides:
        name, sep, value = o.lstrip("+~").partition("=")
        if sep and name == key:
            return value
    return None


def _override_under(overrides: Sequence[str], key: str) -> tuple[str, str] | None:
    """``(key, value)`` of the override that names ``key`` or a key below it."""
    for o in overrides:
        name, sep, value = o.lstrip("+~").partition("=")
        if sep and (name == key or name.startswith(key + ".")):
            return name, value
    return None


def _fields_at(parent: str) -> list[str]:
    node: Any = Config
    for part in filter(None, parent.split(".")):
        found = {f.name: f for f in dataclasses.fields(node)}.get(part)
        sub = found.default_factory() if found and found.default_factory is not dataclasses.MISSING else None
        if not dataclasses.is_dataclass(sub):
            return []
        node = type(sub)
    return [f.name for f in dataclasses.fields(node)]


def _explain(exc: Exception, overrides: Sequence[str]) -> Exception:
    """Hydra's / OmegaConf's composition error as one :class:`ConfigError` line (a "did you mean" for a
    misspelled key or option); other errors unchanged."""
    from hydra.errors import MissingConfigException
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    cause: BaseException | None = exc
    while cause is not None and not isinstance(cause, (OmegaConfBaseException, MissingConfigException)):
        cause = cause.__cause__ or cause.__context__
    if isinstance(cause, MissingConfigException):
        import re

        found = re.search(r"Could not find '([^']+)'", str(cause))
        options = list(getattr(cause, "options", None) or [])
        group, _, wanted = (found.group(1) if found else str(cause).splitlines()[0]).rpartition("/")
        close = difflib.get_close_matches(wanted, options, n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(f'{group}={c}' for c in close)}?" if close else ""
        allowed = f" (options: {', '.join(options)})" if options else ""
        return ConfigError(f"{group or 'config'}={wanted}: no such option{hint}{allowed}")
    if not isinstance(cause, OmegaConfBaseException):
        return exc
    key = str(getattr(cause, "full_key", "") or "")
    given = _override_value(overrides, key)
    if isinstance(cause, ConfigKeyError) or "not in struct" in str(cause) or "Key '" in str(cause):
        named = _override_under(overrides, key)
        return ConfigError(_unknown(key, None, _fields_at(key.rpartition(".")[0]),
                                    named[0][len(key):] if named else "", named[1] if named else None))
    if isinstance(cause, ValidationError):
        what = str(cause).strip().splitlines()[0]
        value = given if given is not None else what.partition("'")[2].partition("'")[0]
        return ConfigError(f"{key}={value}: must be {_expected(key) or what}")
    return ConfigError(f"{key}: {str(cause).strip().splitlines()[0]}")


def to_yaml(cfg: DictConfig) -> str:
    return OmegaConf.to_yaml(cfg, resolve=False)


DOC_HEADER = """# Configuration

Every key of `openmanus-rl train | rollout | eval | data make`, with its type, default and meaning. Generated
from the schema (`openmanus_rl_core/config/schema.py`) by `openmanus-rl config-doc > docs/configuration.md`; a test fails
when this file is stale.

The schema is the only place a default lives. `configs/config.yaml` chooses the options (`env`, `template`,
`reward`, `allocator`, `algorithm`); an option file (`algorithm/ppo.yaml`, a plugin's `env/<name>.yaml`) sets only
what differs from these defaults. Any key is overridden on the command line (`trainer.total_steps=10`); a value of
the wrong type, out of range, or a key that does not exist stops the command before anything starts, with one
line naming the key, the value and what is allowed (exit status 2). Open mappings (type `mapping`) belong to a
plugin, which checks them when it is built. `${...}` defaults follow another key.

Task counts: `env.train_tasks` / `env.val_tasks` size a generated split (the env's option file sets them; the
defaults below apply to an env that does not); `rollout.num_tasks` is only how many tasks `openmanus-rl rollout`
plays; `trainer.val_max_tasks` limits validation.
"""


def _type_name(f: dataclasses.Field) -> str:
    kind = str(f.type)
    words = next((w for t, w in (("List", "list"), ("Dict", "mapping"), ("bool", "bool"), ("int", "int"),
                                 ("float", "float"), ("str", "str"), ("Any", "path or list")) if t in kind), kind)
    return f"{words} or null" if "Optional" in kind else words


def _allowed(f: dataclasses.Field) -> str:
    meta = f.metadata
    parts = []
    if meta.get("choices"):
        parts.append(" \\| ".join(str(c) for c in meta["choices"]))
    if meta.get("ge") is not None:
        parts.append(f">= {meta['ge']:g}")
    if meta.get("gt") is not None:
        parts.append(f"> {meta['gt']:g}")
    return ", ".join(parts)


def _doc_rows(node: type, prefix: str) -> tuple[list[str], list[tuple[str, type]]]:
    rows, subs = [], []
    for f in dataclasses.fields(node):
        default = f.default if f.default_factory is dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            subs.append((f"{prefix}{f.name}", type(default)))
            continue
        shown = "required" if default == "???" else ("null" if default is None else
                                                     str(default).lower() if isinstance(default, bool) else
                                                     f"{default}")
        rows.append(f"| `{prefix}{f.name}` | {_type_name(f)} | `{shown}` | {_allowed(f)} | "
                    f"{f.metadata.get('help', '')} |")
    return rows, subs


def render_doc() -> str:
    """``docs/configuration.md``: one table per schema section."""
    out = [DOC_HEADER]
    top, sections = _doc_rows(Config, "")
    head = ["| key | type | default | allowed | meaning |", "|---|---|---|---|---|"]
    out += ["## Top level", "", *head, *top, ""]
    queue = list(sections)
    while queue:
        key, node = queue.pop(0)
        rows, subs = _doc_rows(node, key + ".")
        doc = (node.__doc__ or "").strip().splitlines()[0] if node.__doc__ else ""
        out += [f"## `{key}`", "", *([doc, ""] if doc and not doc.startswith(node.__name__ + "(") else []),
                *head, *rows, ""]
        queue = subs + queue
    return "\n".join(out).rstrip() + "\n"
