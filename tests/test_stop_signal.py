"""SIGTERM mid-run (a preempted job): the step in progress ends, a checkpoint keeps every step done, the command
says how to continue and exits promptly with 143; the resume reaches the end with every metric row logged before
the signal unchanged. A real ``openmanus-rl train`` subprocess and a real signal."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from openmanus_rl_core.stopping import StopOnSignal
from test_resume_config import SMALL

CLI = str(Path(sys.executable).parent / "openmanus-rl")


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def test_sigterm_mid_run_saves_a_checkpoint_and_the_resume_keeps_every_earlier_row(tmp_path, cli_env):
    run = tmp_path / "run"
    args = [CLI, "train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=200", "trainer.save_freq=0",
            "trainer.val_freq=0"]
    proc = subprocess.Popen(args, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 480
        while not any(r.get("step", 0) >= 2 for r in _rows(run)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        seconds = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, stdout[-3000:] + stderr[-3000:]
    assert seconds < 30, seconds
    rows = _rows(run)
    last = rows[-1]["step"]
    assert 2 <= last < 200
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == [f"step_{last:06d}"]
    assert (f"stopped by SIGTERM after" in stdout and f"steps up to {last} are in {run / 'checkpoints'}" in stdout
            and f"continue with: openmanus-rl train trainer.run_dir={run} trainer.resume=auto" in stdout)
    assert "Traceback" not in stderr and "GCS" not in stderr

    out = subprocess.run([CLI, "train", *SMALL, f"trainer.run_dir={run}", "trainer.resume=auto",
                          f"trainer.total_steps={last + 2}", "trainer.save_freq=0", "trainer.val_freq=0"],
                         env=cli_env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    after = _rows(run)
    assert after[:len(rows)] == rows
    assert [r["step"] for r in after[len(rows):]] == [last + 1, last + 2]


def test_the_second_signal_is_not_waited_for_and_the_first_only_asks(monkeypatch):
    logged, exits = [], []
    monkeypatch.setattr("os._exit", exits.append)
    stop = StopOnSignal(logged.append)
    stop.interrupt = False  # in the step loop
    stop._handle(signal.SIGINT, None)
    assert stop.requested == signal.SIGINT and stop.exit_code == 130 and exits == []
    assert logged == ["SIGINT: stopping after the current step (a checkpoint is saved); send it again to exit at "
                      "once"]
    stop._handle(signal.SIGTERM, None)
    assert exits == [143]

    early = StopOnSignal(logged.append)  # before the first step: at once
    with pytest.raises(KeyboardInterrupt):
        early._handle(signal.SIGTERM, None)
    assert early.requested == signal.SIGTERM and exits == [143]


def test_sigterm_in_the_warm_up_exits_promptly_without_a_checkpoint(tmp_path, cli_env):
    run = tmp_path / "run"
    log = tmp_path / "out.txt"
    args = [CLI, "train", *SMALL, f"trainer.run_dir={run}", "warmup.steps=100000", "trainer.total_steps=5"]
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=cli_env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 480
            while "warm-up step 1/" not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.2)
            proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            proc.wait(timeout=60)
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert proc.returncode == 143, text[-3000:]
    assert seconds < 30, seconds
    assert "stopped by SIGTERM after" in text and "no step completed" in text
    assert "Traceback" not in text and "GCS" not in text
    assert not (run / "checkpoints").exists()
