"""The README's "From a run to a Hugging Face folder" commands, run exactly as written (fresh folder): train ->
eval -> export -> rollout of the exported folder. Each runs the console script's function (``cli.main``) with the
command's words, in this process (in the fresh folder, train on the tests' shared Ray), so none imports torch and
transformers and starts a Ray node again."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def readme_commands(section: str) -> list[list[str]]:
    """The command lines of the first ```bash block after the heading ``section`` in README.md."""
    text = (REPO / "README.md").read_text()
    after = text[text.index(f"### {section}"):]
    block = re.search(r"```bash\n(.*?)```", after, re.S).group(1)
    return [shlex.split(line.split("  #")[0]) for line in block.splitlines() if line.strip()]


@pytest.mark.slow
def test_the_readme_walk_from_training_to_an_exported_folder(tmp_path, ray_local, command_here, monkeypatch):
    commands = readme_commands("From a run to a Hugging Face folder")
    assert [c[:2] for c in commands] == [["openmanus-rl", "train"], ["openmanus-rl", "eval"],
                                         ["openmanus-rl", "export"], ["openmanus-rl", "rollout"]]
    out = {}
    monkeypatch.chdir(tmp_path)
    for cmd in commands:
        proc = command_here([*cmd[1:], "trainer.progress=false"] if cmd[1] == "train" else cmd[1:])
        assert proc.returncode == 0, f"{shlex.join(cmd)}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        out[cmd[1]] = proc.stdout
    run = tmp_path / "outputs" / "quickstart"
    final = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert final["step"] == 4
    # eval took the run's env from the checkpoint and reproduces the run's final validation (greedy, same weights)
    assert "from the run: env=word_copy, template=react" in out["eval"]
    found = re.search(r"success rate ([0-9.]+) \(95% interval ([0-9.]+)-([0-9.]+)\), mean reward ([-0-9.]+)", out["eval"])
    assert float(found.group(1)) == pytest.approx(final["val/success_rate"], abs=1e-3)
    assert float(found.group(4)) == pytest.approx(final["val/reward_mean"], abs=1e-3)
    assert (float(found.group(2)), float(found.group(3))) == pytest.approx(
        (final["val/success_ci_low"], final["val/success_ci_high"]), abs=1e-3)
    assert float(found.group(2)) < float(found.group(1)) < float(found.group(3)) or float(found.group(1)) in (0, 1)
    exported = tmp_path / "outputs" / "quickstart-hf"
    assert {"config.json", "model.safetensors", "generation_config.json"} <= {p.name for p in exported.iterdir()}
    # the exported folder is the trained policy, not the untrained one (which never copies a word)
    assert "episodes: 8 (8 tasks x n=1)" in out["rollout"] and "untrained" not in out["rollout"]
    success = float(re.search(r"success rate: ([0-9.]+)", out["rollout"]).group(1))
    assert success >= 0.5, out["rollout"]
