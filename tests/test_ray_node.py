"""What a local run exposes on the network, and how its Ray goes away: every listening socket of a running
training is on loopback, and the driver shuts Ray down when it ends normally, fails, or gets SIGTERM."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from openmanus_rl_core.distributed.ray_node import is_loopback

SMALL = [
    "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
    "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=4", "algorithm.n=2",
    "env.train_tasks=8", "env.val_tasks=2", "rollout.max_new_tokens=8", "warmup.enabled=false",
    "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=2", "trainer.val_before_train=false",
    "trainer.val_at_end=false", "trainer.val_freq=0", "trainer.save_freq=0", "trainer.save_at_end=false",
]


def _train(run_dir: Path, *extra: str) -> list[str]:
    return [str(Path(sys.executable).parent / "openmanus-rl"), "train", "env=key_door", *SMALL,
            f"trainer.run_dir={run_dir}", *extra]


def _session(sid: int) -> list[psutil.Process]:
    """The live processes of session ``sid`` (the driver started with start_new_session: Ray's daemons, agents
    and workers are in it unless they left it)."""
    out = []
    for p in psutil.process_iter():
        try:
            if os.getsid(p.pid) == sid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def _listening(procs: list[psutil.Process]) -> list[tuple[str, str, int]]:
    """``(process name, ip, port)`` of every listening TCP socket and every bound, unconnected UDP socket."""
    found = []
    for p in procs:
        try:
            for c in p.net_connections(kind="inet"):
                if c.status == psutil.CONN_LISTEN or (c.type == 2 and not c.raddr):
                    found.append((p.name(), c.laddr.ip, c.laddr.port))
        except psutil.NoSuchProcess:
            continue
    return found


def _wait_gone(sid: int, seconds: float) -> list[psutil.Process]:
    deadline = time.time() + seconds
    while (left := _session(sid)) and time.time() < deadline:
        time.sleep(0.5)
    return left


def test_loopback_addresses():
    assert all(is_loopback(ip) for ip in ("127.0.0.1", "127.0.1.1", "::1", "::ffff:127.0.0.1"))
    assert not any(is_loopback(ip) for ip in ("0.0.0.0", "::", "192.0.2.2", "10.0.0.1", "::ffff:10.0.0.1", "fe80::1"))


@pytest.mark.ray
@pytest.mark.slow
def test_a_local_training_run_listens_on_loopback_only_and_sigterm_shuts_ray_down(tmp_path, cli_env):
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(_train(run_dir, "trainer.total_steps=500"), env=cli_env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        metrics = run_dir / "metrics.jsonl"
        deadline = time.time() + 500
        while proc.poll() is None and time.time() < deadline and not (
                metrics.exists() and any(json.loads(line)["step"] >= 1 for line in metrics.read_text().splitlines())):
            time.sleep(0.5)
        assert proc.poll() is None, "the run ended before it was in its training loop"
        procs = _session(proc.pid)
        names = {p.name() for p in procs}
        assert {"gcs_server", "raylet"} <= names, names  # Ray is up; the two workers are in the loop
        sockets = _listening(procs)
        assert len(sockets) >= 5, sockets
        exposed = [s for s in sockets if not is_loopback(s[1])]
        assert exposed == [], f"listening beyond loopback: {exposed}"

        # SIGTERM to the driver alone: it unwinds, shuts Ray down, and nothing of the run is left
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        left = _wait_gone(proc.pid, 30)
        assert left == [], [(p.pid, p.name()) for p in left]
    finally:
        if proc.poll() is None or _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


# The same `finally: trainer.shutdown()` ends the SIGTERM run above (make test); these two endings are variants.
@pytest.mark.long
@pytest.mark.parametrize("how", ["normally", "by an exception"])
def test_the_driver_shuts_ray_down_however_it_ends(tmp_path, cli_env, how):
    # a GPU per worker on a machine without one fails after Ray started, before any worker exists
    extra = ["trainer.total_steps=1"] if how == "normally" else ["trainer.worker_num_gpus=1", "trainer.device=cpu"]
    proc = subprocess.Popen(_train(tmp_path / "run", *extra), env=cli_env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=500)
        if how == "normally":
            assert proc.returncode == 0, out[-3000:]
        else:
            assert proc.returncode == 1 and "needs 2 GPUs but the Ray cluster has 0" in out, out[-3000:]
        left = _wait_gone(proc.pid, 30)
        assert left == [], [(p.pid, p.name()) for p in left]
    finally:
        if proc.poll() is None or _session(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
