"""Training an agent of one's own through the gateway, from the command line: the README's agent trains, a missing
program stops before anything starts, no agent outlives a kill -9 of the trainer, and `serve` answers the SDK. The
training commands run ``cli.main`` in this process, on the tests' shared Ray; the kill -9 and `serve` need a
process of their own."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import openai
import pytest

from test_resume_config import SMALL

ROOT = Path(__file__).resolve().parents[1]
CLI = str(Path(sys.executable).parent / "openmanus-rl")
AGENT = f"{sys.executable} {ROOT / 'examples' / 'key_door_agent.py'}"


def _rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_readme_shows_the_example_agent_as_it_is():
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```python\n(.*?)```", readme[readme.index("## Your own agent"):], re.S).group(1)
    assert block == (ROOT / "examples" / "key_door_agent.py").read_text()


def test_the_readme_agent_trains_from_the_command_line(tmp_path, ray_local, command_here):
    run = tmp_path / "run"
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=2", f"agent.command={AGENT}",
                        "rollout.max_new_tokens=24"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(run)
    assert [r["step"] for r in rows] == [0, 1, 2]
    for r in rows[1:]:  # every episode of the step went through the gateway: 2 tasks x 2 samples
        assert r["gateway/continuous_episodes"] + r["gateway/segmented_episodes"] == 4
        assert r["rollout/termination/env_error"] == 0 and r["rollout/turns/mean"] >= 1
    assert "val/success_rate" in rows[-1] and (run / "checkpoints" / "step_000002").is_dir()


def test_a_missing_agent_program_is_one_line_before_anything_starts(tmp_path, command_here):
    run = tmp_path / "run"
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "agent.command=nosuch-agent --fast"])
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: agent.command='nosuch-agent --fast': the program 'nosuch-agent' is "
                                       "not found on PATH; install it or give its path"]
    assert not run.exists()


@pytest.mark.ray
def test_no_agent_outlives_a_kill_9_of_the_trainer(tmp_path, cli_env):
    """Agents that write their pid and then hang; the trainer is killed -9 while they run."""
    pids = tmp_path / "pids"
    pids.mkdir()
    agent = tmp_path / "hang.py"
    agent.write_text(f"import os, time\nopen(os.path.join({str(pids)!r}, str(os.getpid())), 'w').close()\n"
                     f"time.sleep(600)\n")
    proc = subprocess.Popen([CLI, "train", *SMALL, f"trainer.run_dir={tmp_path / 'run'}", "trainer.total_steps=2",
                             f"agent.command={sys.executable} {agent}", "trainer.val_before_train=false",
                             "warmup.enabled=false"], env=cli_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 300
        while len(list(pids.iterdir())) < 4:  # every agent of step 1 is running
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.2)
        started = [int(p.name) for p in pids.iterdir()]
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        deadline = time.monotonic() + 60
        while any(_alive(pid) for pid in started) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not [pid for pid in started if _alive(pid)]
    finally:
        if proc.poll() is None:
            proc.kill()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return not (status.exists() and status.read_text().split(")")[-1].split()[0] == "Z")  # a zombie is gone


def test_serve_answers_the_sdk_with_its_key_and_stops_on_sigterm(tmp_path, cli_env):
    from tiny_hf import save_tiny

    folder = save_tiny("llama", tmp_path / "model")
    proc = subprocess.Popen([CLI, "serve", f"model.path={folder}", "serve.port=0", "serve.api_key=secret-1",
                             "rollout.max_new_tokens=8"], env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("  export OMRL_MODEL="):
                break
        url = next(line.split("=", 1)[1].strip() for line in lines if "OPENAI_BASE_URL=" in line)
        assert url.startswith("http://127.0.0.1:") and url.endswith("/v1")
        client = openai.OpenAI(base_url=url, api_key="secret-1", max_retries=0)
        out = client.chat.completions.create(model="omrl-policy", messages=[{"role": "user", "content": "hi"}],
                                             max_tokens=5, temperature=0)
        assert out.usage.completion_tokens <= 5 and out.choices[0].finish_reason in ("stop", "length")
        try:
            openai.OpenAI(base_url=url, api_key="secret-2", max_retries=0).models.list()
            raise AssertionError("a wrong key was accepted")
        except openai.AuthenticationError:
            pass
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
        assert proc.returncode == 0 and "stopped serving" in rest
    finally:
        if proc.poll() is None:
            proc.kill()


def test_the_stream_trains_a_function_agent_with_every_token_tagged_by_its_version(tmp_path, ray_local, command_here,
                                                                                   monkeypatch):
    """``rollout.max_staleness=2``: each rank's agents run without lockstep; every episode of a step is handed
    over whole, its staleness counted like the loop's."""
    run = tmp_path / "run"
    monkeypatch.syspath_prepend(str(ROOT))  # the shared Ray puts the root on its workers' path too
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=3",
                        "agent.function=examples.key_door_agent:play", "rollout.max_staleness=2",
                        "rollout.max_new_tokens=24", "trainer.val_freq=0"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = _rows(run)[1:]
    assert [r["step"] for r in rows] == [1, 2, 3]
    for r in rows:
        assert r["stream/groups"] == 2 and r["gateway/continuous_episodes"] + r["gateway/segmented_episodes"] == 4
        assert 0 <= r.get("stream/staleness_max", 0) <= 2
    assert rows[0]["stream/first_batch"] == 1.0 and rows[-1].get("stream/staleness_mean", 0) > 0
