"""Behaviours of the gateway that users rely on, checked through its HTTP API (the ``openai`` SDK and ``httpx`` on
a real :class:`~openmanus_rl_core.gateway.server.Gateway` on 127.0.0.1) and through ``run_agents`` as a trainer
calls it: a NaN reward is refused, the run's length cap holds, greedy and sampled requests never share a generate
call, an agent function taking ``**kwargs`` gets ``model=``, and nothing a command agent left running outlives
``run_agents``. The engine is scripted (its replies are the test's input); it honours ``max_new_tokens`` and
records the settings of each generate call, which is what is checked."""

from __future__ import annotations

import os
import shlex
import sys
import textwrap
import threading
from types import SimpleNamespace

import httpx
import openai
import pytest

from openmanus_rl_core.config.schema import RolloutConfig
from openmanus_rl_core.gateway.agents import AgentJob, run_agents
from openmanus_rl_core.gateway.server import Gateway
from openmanus_rl_core.rollout import sampling_params
from test_gateway import Script
from kills import alive

REPLY = "<action>open the box and read the note</action>"


@pytest.fixture(scope="module")
def tok():
    from openmanus_rl_core.models.loading import build_tokenizer
    from tiny_hf import TEXTS

    return build_tokenizer(TEXTS + [REPLY, "hello"], vocab_size=400)


@pytest.fixture
def gateway(tok):
    made = []

    def make(**kw):
        gw = Gateway(Script(tok, [REPLY]), tok, "omrl-policy", keys=["key"], **kw)  # "key": a static key, as serve's
        made.append(gw)
        return gw

    yield make
    for gw in made:
        gw.close()


def _client(gw, key):
    return openai.OpenAI(base_url=gw.base_url, api_key=key, max_retries=0)


HELLO = [{"role": "user", "content": "hello"}]


def test_a_nan_reward_is_400_and_the_reward_stays_unset(gateway):
    gw = gateway()
    key = gw.open_episode({"task_id": 0})
    for raw in (b'{"reward": NaN}', b'{"reward": NaN, "success": true}'):  # JSON's NaN as Python's json reads it
        resp = httpx.post(gw.base_url + "/rl/reward", content=raw,
                          headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
        assert resp.status_code == 400
        assert resp.json()["error"]["param"] == "reward" and resp.json()["error"]["message"] == \
            "reward must be a number, got nan"
    record = gw.close_episode(key)
    assert (record.reward, record.success) == (None, None)


def test_in_training_max_tokens_is_capped_at_the_runs_max_new_tokens_and_a_smaller_one_is_honoured(gateway, tok):
    full = len(tok.encode(REPLY, add_special_tokens=False)) + 1
    assert full > 8  # the reply is longer than the run's cap
    gw = gateway()
    key = gw.open_episode({"task_id": 0}, sampling_params(RolloutConfig(max_new_tokens=8)))
    client = _client(gw, key)
    for asked, got in ((None, 8), (100, 8), (3, 3)):
        extra = {} if asked is None else {"max_tokens": asked}
        out = client.chat.completions.create(model="omrl-policy", messages=HELLO, **extra)
        assert (out.usage.completion_tokens, out.choices[0].finish_reason) == (got, "length"), asked
    out = client.chat.completions.create(model="omrl-policy", messages=HELLO, max_completion_tokens=5)
    assert out.usage.completion_tokens == 5
    assert [params.max_new_tokens for params in gw.batcher.engine.params] == [8, 8, 3, 5]
    assert [len(c.completion_ids) for c in gw.close_episode(key).calls] == [8, 8, 3, 5]


def _at_once(gw, asks):
    """Runs ``asks`` (key, request kwargs) concurrently through the SDK; their replies."""
    replies: dict = {}

    def ask(i, key, kwargs):
        replies[i] = _client(gw, key).chat.completions.create(model="omrl-policy", messages=HELLO, **kwargs)

    threads = [threading.Thread(target=ask, args=(i, key, kw)) for i, (key, kw) in enumerate(asks)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert len(replies) == len(asks)
    return [replies[i] for i in range(len(asks))]


def test_a_greedy_request_and_a_sampled_one_never_share_a_generate_call(gateway):
    # Training: a validation episode (greedy) and a training one (sampled), both running, so the batch waits for
    # both requests; the two settings differ only in ``greedy``.
    gw = gateway(batch_wait_s=5.0)
    greedy = [gw.open_episode({"task_id": i}, sampling_params(RolloutConfig(greedy=True))) for i in (0, 1)]
    sampled = gw.open_episode({"task_id": 2}, sampling_params(RolloutConfig(greedy=False)))
    for key in (*greedy, sampled):
        gw.agent_running(key, True)
    _at_once(gw, [(greedy[0], {}), (sampled, {}), (greedy[1], {})])
    engine = gw.batcher.engine
    assert sorted((n, p.greedy) for n, p in zip(engine.batches, engine.params)) == [(1, False), (2, True)]
    # Serving: temperature 0 is greedy; it and a temperature-1 request arriving together go to separate calls.
    gw = gateway(batch_wait_s=1.0)
    _at_once(gw, [("key", {"temperature": 0}), ("key", {"temperature": 1.0}), ("key", {"temperature": 0})])
    engine = gw.batcher.engine
    assert sorted((n, p.greedy) for n, p in zip(engine.batches, engine.params)) == [(1, False), (2, True)]


def _cfg(command=None, function=None, timeout_s=30.0):
    return SimpleNamespace(command=command, function=function, max_concurrent=4, timeout_s=timeout_s,
                           model_name="omrl-policy")


FUNCTIONS = '''
async def with_kwargs(client, task, **kwargs):
    return 1.0 if kwargs == {"model": "omrl-policy"} else 0.0

async def plain(client, task):
    return 0.5
'''


def test_an_agent_function_declared_with_kwargs_receives_model(tmp_path, monkeypatch):
    (tmp_path / "omrl_kwargs_agent.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "omrl_kwargs_agent", raising=False)
    logged: list[str] = []
    [out] = run_agents([AgentJob("k", {"task_id": 0})], _cfg(function="omrl_kwargs_agent:with_kwargs"),
                       "http://127.0.0.1:9/v1", "omrl-policy", logged.append)
    assert (out.reward, out.error, logged) == (1.0, None, [])
    [out] = run_agents([AgentJob("k", {"task_id": 0})], _cfg(function="omrl_kwargs_agent:plain"),
                       "http://127.0.0.1:9/v1", "omrl-policy", logged.append)
    assert (out.reward, out.error, logged) == (0.5, None, [])  # no model= for a function that takes none


@pytest.mark.parametrize("its_stderr", [
    pytest.param("subprocess.DEVNULL", id="own-stderr"),
    # The process left behind holds the agent's stderr pipe (asyncio's Process.wait() would wait for it to close).
    pytest.param("None", id="inherited-stderr"),
])
def test_a_process_left_behind_by_a_command_agent_that_exits_0_is_gone_when_run_agents_returns(tmp_path, its_stderr):
    pids = tmp_path / "pids"
    script = tmp_path / "agent.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess
        child = subprocess.Popen(["sleep", "1000"], stderr={its_stderr})  # started, never waited for: left behind
        with open({str(pids)!r}, "a") as f:
            f.write(f"{{child.pid}}\\n")
    """))
    command = f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"
    logged: list[str] = []
    try:
        outcomes = run_agents([AgentJob(f"k{i}", {"task_id": i}) for i in range(3)],
                              _cfg(command=command, timeout_s=10), "http://127.0.0.1:9/v1", "omrl-policy",
                              logged.append)
        left = [int(p) for p in pids.read_text().split()]
        assert [(o.reward, o.error) for o in outcomes] == [(None, None)] * 3 and logged == []
        assert all(o.seconds < 5 for o in outcomes)  # the agent's exit ends its episode, not the timeout
        assert len(left) == 3 and [pid for pid in left if alive(pid)] == []  # at once, not a moment later
    finally:
        for pid in (int(p) for p in pids.read_text().split()) if pids.exists() else ():
            if alive(pid):  # only when the test failed
                os.kill(pid, 9)
