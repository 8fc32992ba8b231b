"""env=verifiers: environments written with verifiers' own API (0.4, v1), in modules written here, as the trainer
reads them (rows, prompts, task columns), one episode played by the agent against an OpenAI-compatible endpoint, a
bad id refused in one line, and a 3-step GRPO run from the command line whose reward is the verifiers rubric's."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env
from openmanus_rl_env_verifiers import spec
from openmanus_rl_env_verifiers.agent import VerifiersEpisodeError, play
from openmanus_rl_env_verifiers.env import VerifiersEnv

SMALL = ["trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1", "trainer.num_workers=1",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=2",
         "env.train_tasks=4", "env.val_tasks=2", "warmup.steps=1", "rollout.max_new_tokens=4"]

# A verifiers environment as its author writes it: a Taskset of typed tasks, and a rubric. This one's rubric
# gives 0.25 to any reply, so a run's reward is the rubric's exactly.
QUARTER = '''
import verifiers.v1 as vf

WORDS = ["apple", "banana", "cherry", "delta"]


class QuarterData(vf.TaskData):
    answer: str


class QuarterTask(vf.Task[QuarterData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def quarter(self, trace: vf.Trace) -> float:
        return 0.25


class QuarterTaskset(vf.Taskset[QuarterTask, vf.TasksetConfig]):
    def load(self):
        for i, w in enumerate(WORDS):
            yield QuarterTask(QuarterData(id=f"say-{i}", prompt=f"Reply with the word {w} and nothing else.",
                                          answer=w), self.config.task)


__all__ = ["QuarterTaskset"]
'''

# Exact match on the reply; the rubric of the row "boom" fails.
EXACT = '''
import verifiers.v1 as vf


class ExactData(vf.TaskData):
    answer: str


class ExactTask(vf.Task[ExactData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def exact(self, trace: vf.Trace) -> float:
        if self.data.answer == "boom":
            raise RuntimeError("the rubric broke")
        return float(trace.last_reply.strip().lower() == self.data.answer)


class ExactTaskset(vf.Taskset[ExactTask, vf.TasksetConfig]):
    def load(self):
        for w in ["apple", "banana", "boom"]:
            yield ExactTask(ExactData(id=w, prompt=f"Say {w}.", system_prompt="Answer in one word.", answer=w),
                            self.config.task)


__all__ = ["ExactTaskset"]
'''


@pytest.fixture(scope="module")
def envs_dir(tmp_path_factory):
    """A folder holding the two environments' modules, importable here (and by the workers of ray_with_the_envs)."""
    folder = tmp_path_factory.mktemp("vf_envs")
    (folder / "omrl_vf_quarter.py").write_text(QUARTER)
    (folder / "omrl_vf_exact.py").write_text(EXACT)
    sys.path.insert(0, str(folder))
    yield folder
    sys.path.remove(str(folder))


def test_rows_prompts_and_task_columns(envs_dir):
    env = registry("env").build("verifiers", id="omrl_vf_quarter")
    assert isinstance(env, VerifiersEnv) and env.num_tasks == 4
    assert env.reset(1, 0) == "Reply with the word banana and nothing else."
    assert env.reset(5, 0) == env.reset(1, 7)  # ids wrap around the rows; the seed changes nothing
    assert env.task_fields(2) == {"verifiers_id": "omrl_vf_quarter", "verifiers_task": "say-2",
                                  "verifiers_settings": json.dumps({"max_tasks": None, "taskset": {}})}
    step = env.step("anything")
    assert step.done and step.reward == 0.0
    check_env(lambda: VerifiersEnv(id="omrl_vf_quarter"), task_ids=[0, 3])
    # an owner/name@version id names the same module; max_tasks keeps the first rows
    assert VerifiersEnv(id="someone/omrl-vf-quarter@0.1", max_tasks=2).num_tasks == 2
    # the system prompt leads the row's text (the tokenizer corpus is built from it)
    assert VerifiersEnv(id="omrl_vf_exact").reset(0) == "Answer in one word.\n\nSay apple."


def test_bad_settings_are_one_line(envs_dir):
    with pytest.raises(ValueError, match=r"^id=null: required: the verifiers environment to train"):
        VerifiersEnv.Kwargs(id=None)
    with pytest.raises(ValueError, match=r"^id=json: not a verifiers environment: taskset module 'json' exports no "
                                         r"Taskset subclass"):
        VerifiersEnv.Kwargs(id="json")
    with pytest.raises(ValueError, match=r"^taskset\.bogus=1: the taskset omrl_vf_quarter refuses it: Extra inputs"):
        VerifiersEnv.Kwargs(id="omrl_vf_quarter", taskset={"bogus": 1})
    with pytest.raises(ValueError, match=r"^max_tasks=0: must be >= 1 or null$"):
        VerifiersEnv.Kwargs(id="omrl_vf_quarter", max_tasks=0)


def test_bad_id_stops_the_command_in_one_line(envs_dir, tmp_path, capfd):
    from types import SimpleNamespace

    from openmanus_rl_core.cli import main

    run = tmp_path / "run"
    capfd.readouterr()
    code = main(["train", "env=verifiers", "reward=verifiers", "env.kwargs.id=no_such_verifiers_env",
                 f"trainer.run_dir={run}"])  # the command's function, in this process
    printed = capfd.readouterr()
    out = SimpleNamespace(returncode=code, stdout=printed.out, stderr=printed.err)
    assert out.returncode == 2, out.stdout[-2000:] + out.stderr[-2000:]
    assert out.stderr.strip().splitlines() == [
        "error: env.kwargs.id=no_such_verifiers_env: not a verifiers environment: no module 'no_such_verifiers_env' "
        "is installed; install the environment (or put its module on PYTHONPATH) (env 'verifiers')"]
    assert not run.exists()  # nothing was started


class _Endpoint(BaseHTTPRequestHandler):
    """An OpenAI-compatible chat endpoint that always replies "apple", recording each request."""

    seen: list = []

    def do_POST(self):  # noqa: N802
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        _Endpoint.seen.append((self.path, self.headers.get("authorization"), body))
        out = json.dumps({"id": "c", "object": "chat.completion", "created": int(time.time()), "model": body["model"],
                          "choices": [{"index": 0, "finish_reason": "stop",
                                       "message": {"role": "assistant", "content": "apple"}}],
                          "usage": {"prompt_tokens": 5, "completion_tokens": 1, "total_tokens": 6}}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_play_runs_one_verifiers_episode_per_call(envs_dir):
    import openai

    server = ThreadingHTTPServer(("127.0.0.1", 0), _Endpoint)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    env = VerifiersEnv(id="omrl_vf_exact")
    rows = [{"task_id": i, "seed": 0, **env.task_fields(i)} for i in range(3)]

    async def episodes():
        clients = [openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{server.server_port}/v1", api_key=f"omrl-ep-{i}")
                   for i in range(3)]
        return await asyncio.gather(*(play(c, row, "omrl-policy") for c, row in zip(clients, rows)),
                                    return_exceptions=True)

    try:
        _Endpoint.seen.clear()
        apple, banana, boom = asyncio.run(episodes())
    finally:
        server.shutdown()
    assert (apple, banana) == (1.0, 0.0)  # the rubric's reward of each row, episodes running together
    assert isinstance(boom, VerifiersEpisodeError) and "the rubric broke" in str(boom)
    # each episode's call reached the endpoint with its own key, the policy's name and the row's conversation
    calls = {auth: body for _, auth, body in _Endpoint.seen}
    assert set(calls) == {"Bearer omrl-ep-0", "Bearer omrl-ep-1", "Bearer omrl-ep-2"}
    assert {path for path, _, _ in _Endpoint.seen} == {"/v1/chat/completions"}
    assert calls["Bearer omrl-ep-1"]["model"] == "omrl-policy"
    assert calls["Bearer omrl-ep-1"]["messages"] == [{"role": "system", "content": "Answer in one word."},
                                                     {"role": "user", "content": "Say banana."}]
    assert not [k for k in os.environ if k.startswith("OMRL_VERIFIERS_KEY_")]  # each key left with its episode
    with pytest.raises(VerifiersEpisodeError, match="no verifiers_id"):
        asyncio.run(play(openai.AsyncOpenAI(base_url="http://127.0.0.1:9/v1", api_key="k"), {"task_id": 0}, "m"))


@pytest.fixture(scope="module")
def ray_with_the_envs(envs_dir):
    """A local Ray, as a run starts its own, whose workers import the environments' modules: Ray puts the folder it
    starts in on its workers' ``sys.path``, as PYTHONPATH does for a command's own Ray. The process is left as it was
    found (as tests/conftest.py's ``process_state_kept`` leaves it: environment, SIGTERM handler, ``print``, torch's
    thread count, Ray's cached token-auth mode)."""
    import builtins
    import signal

    import ray
    import torch
    from ray._raylet import AuthenticationTokenLoader, Config

    from openmanus_rl_core.distributed.ray_node import start_ray

    assert not ray.is_initialized(), "another test left a Ray up in this process"
    env, sigterm, printer, here = dict(os.environ), signal.getsignal(signal.SIGTERM), builtins.print, os.getcwd()
    threads = torch.get_num_threads()
    os.chdir(envs_dir)
    try:
        start_ray(None, 1, logging_level="warning")
    finally:
        os.chdir(here)
        os.environ.clear()
        os.environ.update(env)
    yield
    ray.shutdown()
    Config.initialize("")  # read RAY_AUTH_MODE again, as Ray does when it turns token mode on
    AuthenticationTokenLoader.instance().reset_cache()
    signal.signal(signal.SIGTERM, sigterm)
    builtins.print = printer
    torch.set_num_threads(threads)


@pytest.mark.ray
def test_train_three_steps_from_the_cli_scores_the_verifiers_reward(envs_dir, ray_with_the_envs, tmp_path, capfd):
    from openmanus_rl_core.cli import main

    run = tmp_path / "run"
    capfd.readouterr()
    code = main(["train", "env=verifiers", "reward=verifiers", "env.kwargs.id=omrl_vf_quarter", "trainer.total_steps=3",
                 *SMALL, f"trainer.run_dir={run}"])  # the command's function, in this process, on the module's Ray
    out = capfd.readouterr()
    assert code == 0, out.out[-3000:] + out.err[-3000:]
    assert "warm-up skipped: env 'verifiers' has no oracle" in out.out
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert {1, 2, 3} <= set(rows)
    for step in (1, 2, 3):
        r = rows[step]
        # every episode of the step (2 tasks x 2 samples) went through the gateway, none failed
        assert r["gateway/continuous_episodes"] + r["gateway/segmented_episodes"] == 4
        assert r["rollout/termination/env_error"] == 0
        assert r["train/reward_mean"] == 0.25 and r["train/reward/goal/mean"] == 0.25  # the rubric's, exactly
    samples = [json.loads(line) for line in (run / "validation" / "val_step_000003.jsonl").read_text().splitlines()]
    assert len(samples) == 2 and all(s["reward"] == 0.25 and s["info"]["gateway"] for s in samples)
    assert samples[0]["task"]["verifiers_id"] == "omrl_vf_quarter"
