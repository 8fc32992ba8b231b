"""The typed configuration: bad values stop the command before anything starts, the YAML restates no default,
every schema key is read and nothing outside it, and docs/configuration.md is what the schema says."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
from openmanus_rl_core.config import rules as config_rules, schema
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load, render_doc, schema_keys

ROOT = Path(__file__).resolve().parents[1]
CORE = ROOT / "openmanus_rl_core"

# The CLI in a fresh interpreter; the last stdout line tells whether Ray or torch was ever imported.
PROBE = ("import sys; from openmanus_rl_core.cli import main; rc = main(sys.argv[1:]); "
         "print(__import__('json').dumps({'ray': 'ray' in sys.modules, 'torch': 'torch' in sys.modules})); "
         "sys.exit(rc)")


@pytest.mark.parametrize("override, message", [
    ("trainer.total_steps=-5", "trainer.total_steps=-5: must be >= 0"),
    ("rollout.n=0", "rollout.n=0: must be >= 1"),
    ("env.max_turns=0", "env.max_turns=0: must be >= 1"),
    ("trainer.max_checkpoints=-1", "trainer.max_checkpoints=-1: must be >= 1"),
    ("trainer.total_steps=abc", "trainer.total_steps=abc: must be an integer"),
    ("trainer.totl_steps=5", "trainer.totl_steps=5: unknown key; did you mean trainer.total_steps?"),
])
def test_a_bad_value_is_one_line_and_exit_2_before_anything_starts(override, message, tmp_path):
    out = tmp_path / "outputs"
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run([sys.executable, "-c", PROBE, "train", override, f"trainer.output_dir={out}"],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu_s = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.splitlines() == [f"error: {message}"]  # one line, no traceback
    assert json.loads(proc.stdout.splitlines()[-1]) == {"ray": False, "torch": False}  # no Ray, no worker, no model
    assert not out.exists() and not (tmp_path / "outputs").exists()  # no run directory
    assert cpu_s < 5.0  # CPU seconds: a shared machine's load must not fail the check


@pytest.mark.parametrize("overrides, message", [
    (["algorithm.n=1"], "rollout.n=1: algorithm.adv_estimator=grpo compares samples within a group and needs "
                        "rollout.n >= 2"),
    (["algorithm=ppo", "algorithm.use_critic=false"], "algorithm.use_critic=False: algorithm.adv_estimator=gae "
                                                      "reads values and needs algorithm.use_critic=true"),
    (["algorithm.adv_estimator=state_baseline", "algorithm.use_kl_in_reward=true"],
     "algorithm.use_kl_in_reward=true: algorithm.adv_estimator=state_baseline reads each turn's reward"),
    (["algorithm.adv_estimator=value_table", "algorithm.use_kl_in_reward=true"],
     "algorithm.use_kl_in_reward=true: algorithm.adv_estimator=value_table reads each turn's reward"),
    (["rollout.max_new_tokens=600"], "rollout.max_new_tokens=600: one reply cannot exceed "
                                     "rollout.max_response_tokens=512"),
    (["trainer.device=tpu"], "trainer.device=tpu: allowed values are auto, cpu, cuda"),
    (["trainer.val_greedy=maybe"], "trainer.val_greedy=maybe: must be true or false"),
    (["trainer.val_max_tasks=x"], "trainer.val_max_tasks=x: must be an integer or null"),
    (["+trainer.loggerz=[]"], "trainer.loggerz: unknown key; did you mean trainer.loggers?"),
    (["actr.lr=1"], "actr.lr=1: unknown key; did you mean actor.lr"),
    (["algorithm.ref_reset_steps=10"], "algorithm.ref_reset_steps=10: it moves the KL term's reference, and no KL"),
    (["algorithm.choice_kl_coeff=0.1"], "algorithm.choice_kl_coeff=0.1: it acts where a constraint chose the reply's"),
    (["algorithm.all_action_coeff=1"], "algorithm.all_action_coeff=1.0: it moves the tokens a constraint allowed, and "
                                       "rollout.constrain_actions is off"),
    (["algorithm.all_action_coeff=1", "rollout.constrain_actions=true"],
     "algorithm.all_action_coeff=1.0: it reads each allowed token's value, and algorithm.adv_estimator=grpo gives "
     "none; use value_table"),
    (["env=key_dor"], "env=key_dor: no such option; did you mean env=key_door"),
    (["algorithm.loss_cfg.clip_low=0.1", "algorithm.kl_ctrl.type=pid"],
     "algorithm.kl_ctrl.type=pid: allowed values are fixed, adaptive"),
])
def test_cross_field_rules_choices_types_and_close_matches(overrides, message):
    with pytest.raises(ConfigError) as err:
        load(overrides)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_an_unknown_component_name_is_answered_with_close_matches():
    from openmanus_rl_core.plugin.registry import UnknownPluginError

    with pytest.raises(UnknownPluginError, match=r"unknown reward 'gaol'. Did you mean 'goal'\?"):
        load(["reward.components.goal.name=gaol"])


def test_group_size_rule_is_for_training_only():
    assert load(["algorithm.n=1"], training=False).rollout.n == 1


def test_the_yaml_restates_no_default():
    """The embedded default composes to exactly the schema's defaults outside the chosen options."""
    cfg = load([])
    # A user's model gets the pretrained recipe, which is the schema's defaults; the tiny recipe (the embedded
    # default) changes exactly the keys configs/model/tiny.yaml names.
    pretrained = load(["model.path=/models/m"])
    tiny_keys = {"model.recipe", "actor.lr", "critic.lr", "warmup.enabled", "warmup.lr"}
    for section, kind in (("model", schema.ModelConfig), ("trainer", schema.TrainerConfig),
                          ("actor", schema.ActorConfig), ("critic", schema.CriticConfig),
                          ("warmup", schema.WarmupConfig)):
        want = dataclasses.asdict(kind())
        assert dataclasses.asdict(getattr(pretrained, section)) == {**want, **(
            {"path": "/models/m"} if section == "model" else {})}, section
        got = dataclasses.asdict(getattr(cfg, section))
        assert {f"{section}.{k}" for k in want if got[k] != want[k]} == {k for k in tiny_keys
                                                                          if k.startswith(section + ".")}, section
    assert (pretrained.actor.lr, pretrained.critic.lr, pretrained.warmup.enabled) == (1e-6, 1e-5, False)
    assert load(["model.path=/models/m", "model=tiny"]).actor.lr == 5.0e-4  # an explicit choice is kept
    interpolated = {"rollout": ("n", "max_turns"), "data": ("dir", "seed")}  # ${...}: follow other keys
    for section, kind in (("rollout", schema.RolloutConfig), ("data", schema.DataConfig)):
        got, want = dataclasses.asdict(getattr(cfg, section)), dataclasses.asdict(kind())
        for key in interpolated[section]:
            assert isinstance(want.pop(key), str) and got.pop(key) is not None
        assert got == want, section
    # The schema's algorithm defaults are GRPO's: algorithm/grpo.yaml names the estimator and nothing else.
    assert dataclasses.asdict(cfg.algorithm) == dataclasses.asdict(schema.AlgorithmConfig())
    # The values the embedded default run uses (README table): one place, no contradiction left.
    assert (cfg.trainer.total_steps, cfg.actor.lr, cfg.data.train_batch_size) == (60, 5.0e-4, 16)
    assert (cfg.warmup.steps, cfg.warmup.lr, cfg.warmup.warmup_ratio) == (120, 2.0e-3, 0.4)
    assert (cfg.model.tiny.vocab_size, cfg.model.tiny.hidden_size, cfg.model.tiny.initializer_range) == (1024, 128, 0.1)
    assert (cfg.rollout.n, cfg.rollout.max_turns) == (8, 4)  # algorithm.n, env.max_turns (key_door)


def test_every_option_file_composes_and_checks():
    """Every algorithm and env option the installed plugins ship is valid against the schema."""
    from openmanus_rl_core.plugin.registry import registry

    for algorithm in ("grpo", "ppo", "gigpo"):
        assert load([f"algorithm={algorithm}"]).algorithm.adv_estimator in config_rules.GROUP_ESTIMATORS + ("gae",)
    # An option that needs the user's choice (verifiers' environment id) is refused naming the one key it needs.
    needs = {"verifiers": r"env\.kwargs\.id=null: required: ", "python": r"env\.kwargs\.cls=null: required: ",
             "openenv": r"env\.kwargs\.url: give exactly one of url \(a running server\), package .* got none "}
    for env in registry("env").names():
        if env in needs:
            with pytest.raises(ConfigError, match=rf"^{needs[env]}.*\(env '{env}'\)$"):
                load([f"env={env}"], training=False)
        else:
            cfg = load([f"env={env}"], training=False)
            assert cfg.env.name == env and cfg.rollout.max_turns == cfg.env.max_turns >= 1


# ------------------------------------------------------------------------------- schema keys vs. the code
# Which schema class a name stands for, per file (the code reads typed fields through these names only).
ALIASES = {
    "*": {"cfg": schema.Config, "c": schema.Config, "self.cfg": schema.Config, "tcfg": schema.TrainerConfig,
          "wcfg": schema.WarmupConfig, "algo": schema.AlgorithmConfig, "self.algo": schema.AlgorithmConfig,
          "rcfg": schema.RolloutConfig, "model_cfg": schema.ModelConfig, "lora_cfg": schema.LoraConfig},
    "workers": {"ocfg": (schema.ActorConfig, schema.CriticConfig),
                "self.optim_cfg": (schema.ActorConfig, schema.CriticConfig)},
    "rollout": {"cfg": schema.RolloutConfig, "self.cfg": schema.RolloutConfig},
    "cli.py": {"c": None},  # a column name
    "rewards": {"cfg": None},  # the reward components mapping
    "algorithms": {"cfg": None, "ocfg": (schema.ActorConfig, schema.CriticConfig)},  # cfg: kwargs of an estimator or loss
    "engines": {"cfg": None},  # a Hugging Face model config
    "gateway": {"cfg": schema.AgentConfig, "self.cfg": schema.AgentConfig, "agent_cfg": schema.AgentConfig},
    "run": {"trainer.cfg": schema.Config},  # the trainer's parts outside trainer.py take the trainer
}
# Fields read as a whole (dataclasses.asdict) by the component they configure, not field by field.
READ_AS_A_WHOLE = {
    "env.kwargs": "registry.build('env', cfg.env)", "template": "registry.build('template', cfg.template)",
    "allocator": "registry.build('allocator', cfg.allocator)",
    "memory": "registry.build('memory', cfg.memory); memory.window reaches the plugin through memory/<name>.yaml",
    "env.max_turns": "the default of rollout.max_turns (${env.max_turns})",
    "model.tiny": "models.load_model_and_tokenizer passes it to build_tiny_model",
    "agent.reward_option": "config.loading.agent_options, when the config is composed",
    "agent.template_option": "config.loading.agent_options, when the config is composed",
    "algorithm.kl_ctrl": "run.setup.setup passes it to make_kl_controller",
    "algorithm.norm_by_std": "the estimator's kwargs (Trainer.phase_advantages)",
    "algorithm.epsilon": "the estimator's kwargs", "algorithm.step_weight": "the estimator's kwargs",
    "algorithm.gamma": "the estimator's kwargs", "algorithm.lam": "the estimator's kwargs",
    "algorithm.value_window": "the estimator's kwargs",
}


def _chain(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _field_names(kinds) -> set[str]:
    kinds = kinds if isinstance(kinds, tuple) else (kinds,)
    return {f.name for k in kinds for f in dataclasses.fields(k)}


def _reads() -> tuple[set[str], list[str]]:
    """Schema keys the core reads (dotted, from the section down), and reads of fields that do not exist."""
    read, outside = set(), []
    for path in sorted(CORE.rglob("*.py")):
        if path.relative_to(CORE).as_posix() in ("config/schema.py", "config/loading.py"):
            continue
        # A package's files share one entry (its folder's name); a top-level module has its own.
        aliases = {**ALIASES["*"], **ALIASES.get(path.relative_to(CORE).parts[0], {})}
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            chain = _chain(node) if isinstance(node, ast.Attribute) else None
            if not chain:
                continue
            for width in (2, 1):  # "self.cfg" before "self"
                root = ".".join(chain[:width])
                if root in aliases and aliases[root] is None:
                    break
                if aliases.get(root) is not None and len(chain) > width:
                    kind, rest, prefix = aliases[root], chain[width:], []
                    for attr in rest:
                        names = _field_names(kind)
                        if attr not in names:
                            if not (isinstance(kind, type) and hasattr(kind, attr)):  # a method, not a key
                                outside.append(f"{path.name}: {'.'.join(chain)}")
                            break
                        prefix.append(attr)
                        sub = [f for k in (kind if isinstance(kind, tuple) else (kind,)) for f in dataclasses.fields(k)
                               if f.name == attr][0]
                        default = sub.default_factory() if sub.default_factory is not dataclasses.MISSING else None
                        if not dataclasses.is_dataclass(default):
                            break
                        kind = type(default)
                    if prefix:
                        read.add(".".join(prefix))
                    break
    return read, outside


def _section_of(kind) -> str:
    for f in dataclasses.fields(schema.Config):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default) and isinstance(default, kind if isinstance(kind, tuple) else (kind,)):
            return f.name
    return ""


def test_every_schema_key_is_read_and_nothing_outside_it():
    read, outside = _reads()
    assert outside == []  # the code reads no key the schema lacks
    # A read through an alias (tcfg.total_steps) names the key from its section on; qualify it.
    qualified = set()
    for key in read:
        qualified.add(key)
        for alias_kind in (schema.TrainerConfig, schema.WarmupConfig, schema.AlgorithmConfig, schema.RolloutConfig,
                           schema.ModelConfig, schema.ActorConfig, schema.CriticConfig, schema.AgentConfig):
            if key.split(".")[0] in _field_names(alias_kind):
                qualified.add(f"{_section_of(alias_kind)}.{key}")
        if key.split(".")[0] in _field_names(schema.LoraConfig):
            qualified.add(f"model.lora.{key}")
    unread = [k for k in schema_keys() if k not in qualified
              and not any(k == w or k.startswith(w + ".") for w in READ_AS_A_WHOLE)]
    assert unread == []


def test_no_select_and_no_restated_defaults_in_the_core():
    """The code reads typed fields: no select(cfg, key, default), no cfg.get(key, default) on a config."""
    for path in sorted(CORE.rglob("*.py")):
        text = path.read_text()
        assert "select(cfg" not in text and "select(c," not in text and "select(self.cfg" not in text, path.name
        assert "_get(model_cfg" not in text and "wcfg.get(" not in text and "algo.get(" not in text, path.name


def test_the_configuration_doc_is_generated_from_the_schema():
    doc = (ROOT / "docs" / "configuration.md").read_text()
    assert doc == render_doc(), "docs/configuration.md is stale: openmanus-rl config-doc > docs/configuration.md"
    for key in schema_keys():
        assert f"| `{key}` |" in doc, key


def test_the_cli_prints_the_doc():
    proc = subprocess.run([sys.executable, "-m", "openmanus_rl_core.cli", "config-doc"], capture_output=True,
                          text=True, timeout=120, env={**os.environ})
    assert proc.returncode == 0 and proc.stdout == render_doc()


def _bounded(node=schema.Config, prefix: str = ""):
    """``(key, bound)`` of every schema field with a strict lower bound ("> x")."""
    for f in dataclasses.fields(node):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else None
        if dataclasses.is_dataclass(default):
            yield from _bounded(type(default), f"{prefix}{f.name}.")
        elif f.metadata.get("gt") is not None:
            yield f"{prefix}{f.name}", f.metadata["gt"]


GT_FIELDS = list(_bounded())


def test_the_strictly_bounded_options_include_temperature_and_lr():
    keys = {k for k, _ in GT_FIELDS}
    assert {"rollout.temperature", "actor.lr", "critic.lr", "warmup.lr", "rollout.top_p"} <= keys


@pytest.mark.parametrize("key, bound", GT_FIELDS, ids=[k for k, _ in GT_FIELDS])
def test_an_option_bounded_by_greater_than_x_is_refused_exactly_at_x_and_accepted_just_above(key, bound):
    with pytest.raises(ConfigError) as err:
        load([f"{key}={bound}"])
    assert str(err.value) == f"{key}={float(bound)}: must be > {bound:g}"
    above = bound + 1e-3 if key != "rollout.top_p" else 0.5
    cfg = load([f"{key}={above}"])
    section, _, leaf = key.rpartition(".")
    node = cfg
    for part in section.split("."):
        node = getattr(node, part)
    assert getattr(node, leaf) == pytest.approx(above)
