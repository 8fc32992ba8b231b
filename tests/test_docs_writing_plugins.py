"""docs/writing-plugins.md builds a working plugin: its code blocks, assembled as written, install and pass."""

import re
import subprocess
import sys
from pathlib import Path

DOC = Path(__file__).resolve().parents[1] / "docs" / "writing-plugins.md"


def _blocks(text: str) -> dict[str, str]:
    """Map each file the doc names (`path`: or `path` is ...) to the fenced block that follows it."""
    out = {}
    for m in re.finditer(r"`([\w./-]+\.(?:toml|py|yaml))`[^\n]*\n\n```\w*\n(.*?)```", text, re.S):
        out[m.group(1)] = m.group(2)
    return out


def test_the_worked_example_installs_conforms_and_resolves(tmp_path, cli_env, throwaway_dists):
    files = _blocks(DOC.read_text())
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
