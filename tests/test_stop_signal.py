"""SIGTERM mid-run (a preempted job): the step in progress ends or is abandoned (a rollout waiting on slow envs), a
checkpoint keeps every step completed, the command says how to continue and exits within trainer.stop_grace_s with
143; the resume reaches the end with every metric row logged before the signal unchanged. A real ``openmanus-rl
train`` subprocess and a real signal; the command that continues it runs in this process (``cli.main``, on the
tests' shared Ray)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from openmanus_rl_core.process.stopping import StopOnSignal
from test_resume_config import SMALL

CLI = str(Path(sys.executable).parent / "openmanus-rl")


def _rows(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")] if path.exists() else []


def _sigterm_after_step_2(args: list[str], run: Path, cli_env: dict, delay_s: float = 0.0):
    """``(process, stdout, stderr, seconds from the signal to the exit, metric rows when it was sent)`` of a
    ``train`` command sent SIGTERM ``delay_s`` after step 2's metrics row was written."""
    proc = subprocess.Popen(args, env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 480
        while not any(r.get("step", 0) >= 2 for r in _rows(run)):
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        time.sleep(delay_s)
        rows = _rows(run)
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=60)
        return proc, stdout, stderr, time.monotonic() - t0, rows
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.long  # make test sends the signal during a slow rollout instead (the last test here), which checks the same
def test_sigterm_mid_run_saves_a_checkpoint_and_the_resume_keeps_every_earlier_row(tmp_path, cli_env):
    run = tmp_path / "run"
    args = [CLI, "train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=200", "trainer.save_freq=0",
            "trainer.val_freq=0"]
    proc, stdout, stderr, seconds, _ = _sigterm_after_step_2(args, run, cli_env)
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
    assert logged == ["SIGINT: stopping (a rollout or validation in progress is abandoned, an update is finished, "
                      "then a checkpoint is saved; exit within infs); send it again to exit at once"]
    assert stop.abandon_now()
    stop._handle(signal.SIGTERM, None)
    assert exits == [143]

    early = StopOnSignal(logged.append)  # before the first step: at once
    with pytest.raises(KeyboardInterrupt):
        early._handle(signal.SIGTERM, None)
    assert early.requested == signal.SIGTERM and exits == [143]


def _signal_when(args: list[str], printed: str, signum: int, log: Path, cli_env: dict) -> tuple[int, float, str]:
    """``(exit status, seconds from the signal to the exit, output)`` of a command sent ``signum`` as soon as its
    output holds ``printed``."""
    with open(log, "w") as out:
        proc = subprocess.Popen(args, env=cli_env, stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            deadline = time.monotonic() + 480
            while printed not in log.read_text():
                assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
                time.sleep(0.05)
            proc.send_signal(signum)
            t0 = time.monotonic()
            proc.wait(timeout=60)
            seconds = time.monotonic() - t0
        finally:
            if proc.poll() is None:
                proc.kill()
    return proc.returncode, seconds, log.read_text()


def _continue_command(text: str) -> list[str]:
    """The command the stopped run printed to continue it, as arguments."""
    line = next(line for line in text.splitlines() if line.startswith("stopped by "))
    return line.split("continue with: ", 1)[1].split()


# Not the defaults (env=key_door, 60 steps): the printed command must continue this run, not start the default one.
OWN = [a for a in SMALL if a != "env=key_door"] + ["env=word_copy", "trainer.total_steps=1", "trainer.val_freq=0"]


def test_sigterm_in_the_warm_up_then_the_printed_command_continues_the_same_run(tmp_path, cli_env, ray_local,
                                                                                command_here):
    run = tmp_path / "run"
    # the signal comes at the warm-up's first step: 60 steps leave it seconds to arrive, and the continued run redoes
    # all of them
    status, seconds, text = _signal_when([CLI, "train", *OWN, f"trainer.run_dir={run}", "warmup.steps=60"],
                                         "warm-up step 1/", signal.SIGTERM, tmp_path / "out.txt", cli_env)
    assert status == 143, text[-3000:]
    assert seconds < 30, seconds
    assert "no step completed" in text and "Traceback" not in text and "GCS" not in text
    assert not (run / "checkpoints").exists()
    record = (run / "config.json").read_bytes()
    command = _continue_command(text)
    assert command == ["openmanus-rl", "train", f"trainer.run_dir={run}", "trainer.resume=auto"]
    out = command_here(command[1:])  # the console script's main, in this process
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert f"trainer.resume=auto: {run} holds no checkpoint; the run starts again from its beginning" in out.stdout
    assert "changed on resume" not in out.stdout and "built the tiny model" not in out.stdout  # the same folder
    assert "warm-up 60 steps at lr" in out.stdout and "warm-up: 60 steps in" in out.stdout  # its own warm-up
    assert (run / "config.json").read_bytes() == record and not (run / "config_history.jsonl").exists()
    saved = torch_load_meta(run / "checkpoints" / "step_000001")
    assert saved["config"]["env"]["name"] == "word_copy" and saved["config"]["warmup"]["steps"] == 60
    assert saved["config"]["trainer"]["total_steps"] == 1


def torch_load_meta(path: Path) -> dict:
    from openmanus_rl_core.checkpoint.store import open_checkpoint

    return open_checkpoint(str(path), keys=["meta"])[1]["meta"]


@pytest.mark.parametrize("signum,printed", [(signal.SIGINT, "recipe model="),
                                            (signal.SIGTERM, "built the tiny model")])
def test_a_stop_while_the_model_or_the_workers_are_built_prints_how_to_continue(tmp_path, cli_env, command_here,
                                                                                signum, printed):
    """Ctrl-C while the model folder is built (a corpus of 4000 oracle episodes), SIGTERM while Ray and the workers
    start: the same one line and exit status as a stop in the step loop, no traceback, and the printed command
    composes this run's own settings."""
    run = tmp_path / "run"
    args = [CLI, "train", *OWN, f"trainer.run_dir={run}", "env.train_tasks=4000", "model.corpus_tasks=4000"]
    status, seconds, text = _signal_when(args, printed, signum, tmp_path / "out.txt", cli_env)
    assert status == 128 + signum, text[-3000:]
    assert seconds < 30, seconds
    stopped = [line for line in text.splitlines() if line.startswith("stopped by ")]
    assert stopped == [f"stopped by {signal.Signals(signum).name} after {stopped[0].split(' after ')[1]}"]
    assert "no step completed; continue with: openmanus-rl train" in stopped[0]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    command = _continue_command(text)
    assert command[:2] == ["openmanus-rl", "train"]
    composed = command_here([*command[1:], "--cfg", "job"])
    cfg = yaml.safe_load(composed.stdout)
    assert cfg["env"]["name"] == "word_copy" and cfg["env"]["train_tasks"] == 4000
    assert cfg["trainer"]["total_steps"] == 1


def test_a_run_that_does_not_stop_within_the_grace_period_exits_then(monkeypatch):
    logged, exits = [], []
    monkeypatch.setattr("os._exit", exits.append)
    stop = StopOnSignal(logged.append, grace_s=0.3).install("continue with: openmanus-rl train ...")
    try:
        stop.interrupt = False
        stop._handle(signal.SIGTERM, None)
        time.sleep(1.0)
    finally:
        stop.restore()
    assert exits == [143]
    assert logged[-1] == ("SIGTERM: the run did not stop within trainer.stop_grace_s=0.3s; exiting without a new "
                          "checkpoint (the newest one stands). continue with: openmanus-rl train ...")

    ended = StopOnSignal(logged.append, grace_s=0.3)  # the run ended in time: no exit afterwards
    ended.interrupt = False
    ended._handle(signal.SIGTERM, None)
    ended.disarm()
    time.sleep(0.6)
    assert exits == [143]


def test_an_abandoned_rollout_draws_its_tasks_again_and_a_stopped_validation_keeps_its_step():
    from openmanus_rl_core.data.sampler import TaskSampler
    from openmanus_rl_core.process.stopping import Abandoned

    logged = []
    stop = StopOnSignal(logged.append)
    sampler = TaskSampler([{"task_id": i} for i in range(10)], 3, seed=0)
    first = sampler.next_batch()
    with pytest.raises(Abandoned):
        with stop.keeping(sampler):
            sampler.next_batch()
            raise Abandoned("rollout abandoned")
    with stop.keeping(sampler):
        drawn = sampler.next_batch()
    replay = TaskSampler([{"task_id": i} for i in range(10)], 3, seed=0)
    assert replay.next_batch() == first and replay.next_batch() == drawn

    assert stop.unless_stopped(lambda s: {"val/success_rate": s}, 0.5) == {"val/success_rate": 0.5}
    calls = SimpleNamespace(n=0)

    def abandoned_validation():
        calls.n += 1
        raise Abandoned("validation abandoned")

    assert stop.unless_stopped(abandoned_validation) == {} and calls.n == 1
    stop.requested = signal.SIGTERM
    assert stop.unless_stopped(abandoned_validation) == {} and calls.n == 1  # stopping: not started at all
    assert logged == ["validation skipped: the run is stopping"] * 2


def test_outside_ray_a_call_is_never_cancelled_and_no_ray_is_started():
    """A worker used in a plain process (a test, no Ray up) asks ``cancelled_call`` at each rollout: "never", and
    ``ray.get_runtime_context()``, which would start a whole local Ray of its own, is not called."""
    script = ("import ray\nfrom openmanus_rl_core.process.stopping import cancelled_call\n"
              "print(cancelled_call()(), ray.is_initialized())")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "False"]


SLOW_ENV = [a for a in SMALL if a != "env=key_door"] + [
    "env=latency", "env.kwargs.inner=key_door", "env.kwargs.median_ms=2500", "env.kwargs.sigma=0",
    "rollout.max_turns=1", "trainer.val_at_end=false",
    # the oracle's episodes (the tokenizer's corpus, the warm-up's demonstrations) would wait on the env too
    "model.corpus_tasks=1", "warmup.enabled=false"]


@pytest.mark.slow
def test_sigterm_during_a_slow_rollout_abandons_the_step_and_keeps_the_completed_ones(tmp_path, cli_env, ray_local,
                                                                                      command_here):
    """Every env step waits 2.5 s: the signal comes 0.5 s into step 3's env calls. The step is given up (not the 2 s
    more it needed), the checkpoint is step 2's, no row of step 3 exists, and the resume plays steps 3 and 4."""
    run = tmp_path / "run"
    args = [CLI, "train", *SLOW_ENV, f"trainer.run_dir={run}", "trainer.total_steps=50", "trainer.save_freq=0",
            "trainer.val_freq=0", "trainer.val_before_train=false"]
    # 0.5 s after step 2's row: step 3's rollout, its replies made, its env calls waiting.
    proc, stdout, stderr, seconds, rows = _sigterm_after_step_2(args, run, cli_env, delay_s=0.5)
    assert proc.returncode == 143, stdout[-3000:] + stderr[-3000:]
    assert seconds < 30, seconds
    assert [r["step"] for r in rows] == [1, 2] and rows[0]["timing/rollout"] > 2.2  # the env waits were real
    assert _rows(run) == rows  # the abandoned step left no row
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_000002"]
    assert "step 3 abandoned: the run is stopping" in stdout, stdout[-3000:]
    assert (f"steps up to 2 are in {run / 'checkpoints'}" in stdout
            and f"continue with: openmanus-rl train trainer.run_dir={run} trainer.resume=auto" in stdout)
    for noise in ("Traceback", "GCS", "Unhandled error", "TaskCancelledError"):
        assert noise not in stderr, stderr[-3000:]

    out = command_here(["train", *SLOW_ENV, f"trainer.run_dir={run}", "trainer.resume=auto", "trainer.total_steps=4",
                        "trainer.save_freq=0", "trainer.val_freq=0", "trainer.val_before_train=false"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    after = _rows(run)
    assert after[:len(rows)] == rows
    assert [r["step"] for r in after[len(rows):]] == [3, 4]


@pytest.mark.ray  # the command starts a Ray of its own
def test_a_stop_during_the_untrained_validation_is_exit_143_one_line_and_no_traceback(tmp_path, cli_env):
    """Every env step waits 20 s: the untrained validation (step 0, sampled: a greedy untrained model's empty reply
    would end its episodes before any step) is still playing when its first alive line ("validation: 2 tasks, 10s")
    comes, and the signal is sent then."""
    run = tmp_path / "run"
    args = [CLI, "train", *[a for a in SLOW_ENV if not a.startswith("env.kwargs.median_ms=")],
            "env.kwargs.median_ms=20000", f"trainer.run_dir={run}", "trainer.total_steps=2",
            "trainer.val_before_train=true", "trainer.val_greedy=false", "env.val_tasks=2"]
    status, seconds, text = _signal_when(args, "validation: 2 tasks", signal.SIGTERM, tmp_path / "out.txt", cli_env)
    assert status == 143, text[-3000:]
    assert seconds < 30, seconds
    stopped = [line for line in text.splitlines() if line.startswith("stopped by ")]
    assert len(stopped) == 1 and stopped[0].startswith("stopped by SIGTERM after "), text[-3000:]
    assert stopped[0].endswith(f"; no step completed; continue with: openmanus-rl train trainer.run_dir={run} "
                               f"trainer.resume=auto")
    assert "step 0 (untrained)" not in text and _rows(run) == []  # no step 0 logged
    for noise in ("Traceback", "KeyboardInterrupt", "GCS", "Unhandled error", "TaskCancelledError"):
        assert noise not in text, text[-3000:]
