"""The `openmanus-rl` command: listing without imports, config printing."""

import json
import subprocess
import sys

import pytest

from openmanus_rl_core.plugin import registry


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
        "value": "openmanus_rl_core.algorithms.estimators:gae_estimator", "status": "ok", "error": None,
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


TWICE = '''
import json, sys
import ray
from openmanus_rl_core.cli import main
base = ["train", "env=key_door", "trainer.total_steps=1", "trainer.progress=false", "trainer.loggers=[]",
        "trainer.num_cpus=1", "trainer.num_workers=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1",
        "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64",
        "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=2", "env.train_tasks=4",
        "env.val_tasks=2", "warmup.steps=1", "rollout.max_new_tokens=4", "trainer.val_before_train=false"]
out = []
for run in sys.argv[1:]:
    rc = main(base + ["trainer.run_dir=" + run])
    out.append({"rc": rc, "ray_left_running": ray.is_initialized()})
print("RESULT " + json.dumps(out))
'''


@pytest.mark.long  # in-process training is make test's through the Python API (test_api.py)
def test_cli_main_train_twice_in_one_process_runs_both_alike(tmp_path, cli_env):
    """A library user calling ``cli.main(["train", ...])`` twice in one process gets two complete runs, the second
    as the first (same seed, same numbers), and no Ray left running after either."""
    runs = [tmp_path / "a", tmp_path / "b"]
    out = subprocess.run([sys.executable, "-c", TWICE, *map(str, runs)], capture_output=True, text=True,
                         env=cli_env, timeout=600)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    result = json.loads(out.stdout.split("RESULT ", 1)[1])
    assert result == [{"rc": 0, "ray_left_running": False}] * 2
    records = [[json.loads(line) for line in (r / "metrics.jsonl").read_text().splitlines()] for r in runs]
    for r in runs:
        assert (r / "checkpoints" / "step_000001" / "COMPLETE").is_file()
    assert [rec["step"] for rec in records[0]] == [rec["step"] for rec in records[1]] == [0, 1]
    same = ("warmup/loss", "actor/entropy", "train/reward_mean", "val/reward_mean", "rollout/response_length/mean")
    for key in same:
        assert records[1][-1 if key != "warmup/loss" else 0][key] == pytest.approx(
            records[0][-1 if key != "warmup/loss" else 0][key], abs=1e-6), key


def test_plugins_hooks_lists_the_hook_plugins_and_options_lists_each_config_option_with_its_package(cli_env):
    hooks = subprocess.run(["openmanus-rl", "plugins", "hooks"], capture_output=True, text=True, env=cli_env,
                           timeout=60)
    assert hooks.returncode == 0, hooks.stderr
    rows = [line.split()[:3] for line in hooks.stdout.splitlines()]
    assert ["hooks", "tensorboard", "openmanus-rl-tensorboard"] in rows
    assert {line.split()[0] for line in hooks.stdout.splitlines()[1:]} == {"hooks"}
    out = subprocess.run(["openmanus-rl", "plugins", "options", "--json"], capture_output=True, text=True,
                         env=cli_env, timeout=60)
    rows = {r["name"]: r["distribution"] for r in json.loads(out.stdout)}
    assert rows["env=textcraft"] == "openmanus-rl-env-textcraft" and rows["reward=process"] == "openmanus-rl-rewards"
    assert rows["algorithm=ppo"] == "openmanus-rl-core"
    assert rows["+experiment=babyai_goto"] == "openmanus-rl-env-babyai"  # a group outside the defaults list
