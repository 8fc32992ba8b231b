"""The `openmanus-rl` command: listing without imports, config printing."""

import json
import subprocess
import sys

from openmanus_rl_core import registry


def test_plugins_listing_imports_neither_torch_nor_any_plugin_module(cli_env):
    modules = sorted({e.module for e in registry.entries()})
    assert modules, "no plugin entry points installed"
    script = (
        "import sys, io, contextlib\n"
        "from openmanus_rl_core.cli import main\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    main(['plugins']); main(['plugins', '--json']); main(['plugins', 'env'])\n"
        f"bad = [m for m in {modules!r} + ['torch', 'transformers', 'ray'] if m in sys.modules]\n"
        "print(bad)\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_plugins_json_lists_kind_name_distribution_version(cli_env):
    out = subprocess.run(["openmanus-rl", "plugins", "--json"], capture_output=True, text=True, env=cli_env, timeout=60)
    rows = json.loads(out.stdout)
    gae = [r for r in rows if r["kind"] == "advantage" and r["name"] == "gae"]
    assert gae == [{
        "kind": "advantage", "name": "gae", "distribution": "openmanus-rl-core", "version": gae[0]["version"],
        "value": "openmanus_rl_core.algorithms.advantages:gae_estimator", "status": "ok", "error": None,
    }]


def test_plugins_kind_filter_and_table(cli_env):
    out = subprocess.run(["openmanus-rl", "plugins", "loss"], capture_output=True, text=True, env=cli_env, timeout=60)
    lines = out.stdout.splitlines()
    assert lines[0].split() == ["KIND", "NAME", "DISTRIBUTION", "VERSION", "STATUS"]
    assert lines[1].split()[:3] == ["loss", "ppo_clip", "openmanus-rl-core"]


def test_unknown_kind_is_an_argparse_error(cli_env):
    out = subprocess.run(["openmanus-rl", "plugins", "envs"], capture_output=True, text=True, env=cli_env, timeout=60)
    assert out.returncode == 2 and "invalid choice: 'envs'" in out.stderr


def test_cfg_job_prints_composed_config_with_overrides(cli_env):
    out = subprocess.run(["openmanus-rl", "rollout", "--cfg", "job", "seed=7"], capture_output=True, text=True,
                         env=cli_env, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "seed: 7" in out.stdout.splitlines()


def test_plugins_hooks_lists_the_hook_plugins_and_options_lists_each_config_option_with_its_package(cli_env):
    hooks = subprocess.run(["openmanus-rl", "plugins", "hooks"], capture_output=True, text=True, env=cli_env,
                           timeout=60)
    assert hooks.returncode == 0, hooks.stderr
    assert ["hooks", "tensorboard", "openmanus-rl-core"] in [line.split()[:3] for line in hooks.stdout.splitlines()]
    assert {line.split()[0] for line in hooks.stdout.splitlines()[1:]} == {"hooks"}
    out = subprocess.run(["openmanus-rl", "plugins", "options", "--json"], capture_output=True, text=True,
                         env=cli_env, timeout=60)
    rows = {r["name"]: r["distribution"] for r in json.loads(out.stdout)}
    assert rows["env=textcraft"] == "openmanus-rl-env-textcraft" and rows["reward=process"] == "openmanus-rl-rewards"
    assert rows["algorithm=ppo"] == "openmanus-rl-core"
    assert rows["+experiment=babyai_goto"] == "openmanus-rl-env-babyai"  # a group outside the defaults list
