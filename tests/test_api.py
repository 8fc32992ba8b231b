"""The Python API: ``openmanus_rl_core.train(overrides, rewards=...)`` runs what the CLI runs, with plain Python
reward callables as components, and returns the final metrics; ``evaluate`` scores the run."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from test_resume_config import SMALL


def test_train_with_a_callable_reward_returns_the_metrics_and_logs_the_component(tmp_path, cli_env):
    run = tmp_path / "run"
    script = textwrap.dedent(f"""
        import json, sys
        import openmanus_rl_core as omrl

        def short(trajectory):
            return 1.0 / (1 + trajectory.num_turns)

        metrics = omrl.train({[*SMALL, "trainer.total_steps=2", f"trainer.run_dir={run}"]!r},
                             rewards={{"short": (short, 0.5), "turns": lambda t: float(t.num_turns)}})
        result = omrl.evaluate([f"trainer.checkpoint={{metrics['run_dir']}}"])
        print("RESULT " + json.dumps({{"metrics": metrics, "eval": result}}))
    """)
    out = subprocess.run([sys.executable, "-c", script], env=cli_env, capture_output=True, text=True, timeout=600,
                         cwd=tmp_path)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    got = json.loads(out.stdout.split("RESULT ", 1)[1])
    metrics = got["metrics"]
    assert metrics["run_dir"] == str(run)
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1]
    assert last["step"] == 2
    turns = last["train/num_turns"]
    assert last["train/reward/turns/mean"] == turns and last["train/reward/turns/raw_mean"] == turns
    assert 0 < last["train/reward/short/raw_mean"] <= 0.5 and \
        abs(last["train/reward/short/mean"] - 0.5 * last["train/reward/short/raw_mean"]) < 1e-9
    assert metrics["train/reward/short/mean"] == last["train/reward/short/mean"]
    assert metrics["val/reward_mean"] == last["val/reward_mean"]
    assert got["eval"]["tasks"] == 2 and "reward/goal/mean" in got["eval"]


def test_a_bad_reward_callable_is_refused_before_anything_starts(tmp_path):
    import pytest

    import openmanus_rl_core as omrl
    from openmanus_rl_core.config import ConfigError

    with pytest.raises(ConfigError) as e:
        omrl.train([*SMALL, f"trainer.run_dir={tmp_path / 'run'}"], rewards={"x": 3})
    assert str(e.value) == "rewards['x']=3: must be a callable fn(trajectory) -> float, or (fn, weight)"
    assert not (tmp_path / "run").exists()
