"""docs/writing-plugins.md builds a working plugin: its code blocks, assembled as written, install and pass."""

import json
import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-plugins.md"
REWARD_PKG = "omrl-brevity/"


def _blocks(text: str) -> dict[str, str]:
    """Map each file the doc names (`path`: or `path` is ...) to the fenced block that follows it."""
    out = {}
    for m in re.finditer(r"`([\w./-]+\.(?:toml|py|yaml))`[^\n]*\n\n```\w*\n(.*?)```", text, re.S):
        out[m.group(1)] = m.group(2)
    return out


def test_the_worked_example_installs_conforms_and_resolves(tmp_path, cli_env, throwaway_dists):
    files = {k: v for k, v in _blocks(DOC.read_text()).items() if not k.startswith(REWARD_PKG)}
    assert set(files) == {
        "pyproject.toml", "omrl_countdown/env.py", "omrl_countdown/configs/env/countdown.yaml",
        "omrl_countdown/hooks.py", "tests/test_countdown.py",
    }
    root = throwaway_dists.install("omrl-countdown", {**files, "omrl_countdown/__init__.py": ""})
    tests = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(root / "tests")], capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert "2 passed" in tests.stdout, tests.stdout + tests.stderr
    listed = subprocess.run(["openmanus-rl", "plugins", "env"], capture_output=True, text=True, env=cli_env)
    row = [line.split() for line in listed.stdout.splitlines() if line.split()[1:2] == ["countdown"]]
    assert row == [["env", "countdown", "omrl-countdown", "0.1.0", "ok"]]
    shown = subprocess.run(["openmanus-rl", "train", "--cfg", "job", "env=countdown"], capture_output=True,
                           text=True, env=cli_env)
    assert "name: countdown" in shown.stdout and "start: 3" in shown.stdout, shown.stderr


def test_the_reward_example_builds_without_warnings_installs_checks_its_kwargs_and_trains(tmp_path, cli_env,
                                                                                         throwaway_dists):
    from test_resume_config import SMALL

    files = {k[len(REWARD_PKG):]: v for k, v in _blocks(DOC.read_text()).items() if k.startswith(REWARD_PKG)}
    assert set(files) == {"pyproject.toml", "omrl_brevity/reward.py", "omrl_brevity/configs/reward/brevity.yaml",
                          "omrl_brevity/hooks.py"}
    root = throwaway_dists.install("omrl-brevity", {**files, "omrl_brevity/__init__.py": ""})
    # The guide's packaging, built as pip builds it: no setuptools warning ("Package would be ignored", license).
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-v", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(tmp_path / "wheel"), str(root)], capture_output=True, text=True,
                           timeout=300)
    assert built.returncode == 0, built.stderr[-3000:]
    assert "would be ignored" not in built.stdout + built.stderr
    assert "Deprecat" not in built.stdout + built.stderr
    listed = subprocess.run(["openmanus-rl", "plugins", "reward"], capture_output=True, text=True, env=cli_env)
    assert ["reward", "brevity", "omrl-brevity", "0.1.0", "ok"] in [line.split() for line in listed.stdout.splitlines()]
    shown = subprocess.run(["openmanus-rl", "train", "--cfg", "job", "reward=brevity"], capture_output=True,
                           text=True, env=cli_env)
    import yaml

    components = yaml.safe_load(shown.stdout)["reward"]["components"]
    assert list(components) == ["goal", "format", "invalid_action", "brevity"], shown.stderr
    assert components["brevity"] == {"name": "brevity", "weight": 0.2, "kwargs": {"max_turns": 4}}
    bad = subprocess.run(["openmanus-rl", "train", "reward=brevity", "reward.components.brevity.kwargs.max_turn=3"],
                         capture_output=True, text=True, env=cli_env, cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == (
        "error: reward.components.brevity.kwargs.max_turn=3: unknown key of the reward 'brevity'; did you mean "
        "reward.components.brevity.kwargs.max_turns?")
    run = tmp_path / "run"
    trained = subprocess.run(["openmanus-rl", "train", *SMALL, "reward=brevity", "trainer.total_steps=1",
                              f"trainer.run_dir={run}"], capture_output=True, text=True, env=cli_env, timeout=600)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    row = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert row["step"] == 1 and "train/reward/brevity/mean" in row and "val/reward/brevity/mean" in row
