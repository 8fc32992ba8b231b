"""The user's agent run once per episode (openmanus_rl_core.gateway.agents): real subprocesses and coroutines, no
gateway (the agents here never call it)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from kills import alive, pids_in, wait_for

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.gateway import agents
from openmanus_rl_core.gateway.agents import AgentJob, check_agent, run_agents

BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens there: these agents never call it


def _cfg(command=None, function=None, max_concurrent=64, timeout_s=30.0):
    return SimpleNamespace(command=command, function=function, max_concurrent=max_concurrent, timeout_s=timeout_s,
                           model_name="omrl-policy")


def _agent(tmp_path: Path, body: str, name: str = "agent.py") -> str:
    """A Python agent script written into ``tmp_path``; its ``agent.command``."""
    script = tmp_path / name
    script.write_text("import json, os, subprocess, sys, time\n" + textwrap.dedent(body))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


# Writes its own pid and that of a `sleep 1000` child to PIDS, then hangs.
HANGING = """
child = subprocess.Popen(["sleep", "1000"])
with open(os.environ["PIDS"], "a") as f:
    f.write(f"{os.getpid()} {child.pid}\\n")
print("agent: waiting for a model that never answers", file=sys.stderr, flush=True)
time.sleep(1000)
"""


def test_command_agent_gets_the_gateway_key_model_and_task_in_its_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("OMRL_TEST_INHERITED", "yes")
    command = _agent(tmp_path, """
        sys.stdout.write("x" * 2_000_000)  # a chatty agent must not block on its stdout
        keep = ("OPENAI_BASE_URL", "OPENAI_API_KEY", "OMRL_MODEL", "OMRL_TASK", "OMRL_TEST_INHERITED")
        out = os.path.join(os.path.dirname(sys.argv[0]), os.environ["OPENAI_API_KEY"] + ".json")
        json.dump({k: os.environ.get(k) for k in keep}, open(out, "w"))
    """)
    tasks = [{"task_id": 3, "seed": 11, "prompt": "open the door"}, {"task_id": 4, "seed": 12, "prompt": "é"}]
    jobs = [AgentJob(f"ep-{i}", task) for i, task in enumerate(tasks)]
    logged = []
    outcomes = run_agents(jobs, _cfg(command=command), BASE_URL, "omrl-policy", logged.append)
    assert [(o.key, o.reward, o.error) for o in outcomes] == [("ep-0", None, None), ("ep-1", None, None)]
    assert logged == []
    for i, task in enumerate(tasks):
        env = json.loads((tmp_path / f"ep-{i}.json").read_text())
        assert env == {"OPENAI_BASE_URL": BASE_URL, "OPENAI_API_KEY": f"ep-{i}", "OMRL_MODEL": "omrl-policy",
                       "OMRL_TASK": json.dumps(task), "OMRL_TEST_INHERITED": "yes"}
        assert json.loads(env["OMRL_TASK"]) == task


def test_no_more_than_max_concurrent_agents_run_at_once(tmp_path, monkeypatch):
    command = _agent(tmp_path, """
        start = time.time(); time.sleep(0.4)
        with open(os.environ["SPANS"], "a") as f:
            f.write(f"{start} {time.time()}\\n")
    """)
    spans_file = tmp_path / "spans"
    monkeypatch.setenv("SPANS", str(spans_file))
    outcomes = run_agents([AgentJob(f"k{i}", {"task_id": i}) for i in range(6)],
                          _cfg(command=command, max_concurrent=2), BASE_URL, "m", print)
    assert [o.error for o in outcomes] == [None] * 6
    assert all(o.seconds >= 0.4 for o in outcomes)  # the agent's own time, not its wait for a slot
    spans = [tuple(map(float, line.split())) for line in spans_file.read_text().splitlines()]
    assert len(spans) == 6
    running = [sum(s <= t < e for s, e in spans) for t, _ in spans]  # agents running when each one started
    assert max(running) == 2


def test_a_hanging_agent_is_killed_at_timeout_with_its_children(tmp_path, monkeypatch):
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    logged = []
    started = time.monotonic()
    outcomes = run_agents([AgentJob("k", {"task_id": 7})], _cfg(command=_agent(tmp_path, HANGING), timeout_s=1),
                          BASE_URL, "m", logged.append)
    took = time.monotonic() - started
    [outcome] = outcomes
    assert (outcome.reward, outcome.error) == (None, "timed out after 1s (killed)")
    assert 1.0 <= outcome.seconds < 1.0 + agents.KILL_GRACE_S and took < 1.0 + agents.KILL_GRACE_S + 1
    assert logged == ["agent for task 7: timed out after 1s (killed); "
                      "stderr tail: agent: waiting for a model that never answers"]
    [[agent_pid, sleep_pid]] = [pids_in(tmp_path / "pids")]
    assert not alive(agent_pid) and not alive(sleep_pid)  # gone when run_agents returns, not later


def test_an_agent_that_ignores_sigterm_is_killed_after_the_grace(tmp_path, monkeypatch):
    monkeypatch.setattr(agents, "KILL_GRACE_S", 0.5)
    command = _agent(tmp_path, """
        import signal
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with open(os.environ["PIDS"], "w") as f:
            f.write(str(os.getpid()))
        time.sleep(1000)
    """)
    monkeypatch.setenv("PIDS", str(tmp_path / "pids"))
    # 3 s: the agent must have set its handler before the timeout, also when a busy machine slows its start
    [outcome] = run_agents([AgentJob("k", {"task_id": 1})], _cfg(command=command, timeout_s=3), BASE_URL, "m",
                           lambda line: None)
    assert outcome.error == "timed out after 3s (killed)"
    assert 3.5 <= outcome.seconds < 5.0  # the timeout, then the grace, then SIGKILL
    assert not alive(pids_in(tmp_path / "pids")[0])


def test_a_crashing_agent_has_its_stderr_tail_in_the_error_and_the_log(tmp_path):
    command = _agent(tmp_path, """
        sys.stderr.write("noise\\n" * 1000)
        sys.stderr.write("Traceback (most recent call last):\\n  File agent.py, line 9\\nValueError: no door here\\n")
        sys.exit(3)
    """)
    logged = []
    outcomes = run_agents([AgentJob("a", {"task_id": 1}), AgentJob("b", {"task_id": 2})], _cfg(command=command),
                          BASE_URL, "m", logged.append)
    traceback = "Traceback (most recent call last):\n  File agent.py, line 9\nValueError: no door here\n"
    kept_noise = (agents.STDERR_TAIL_CHARS - len(traceback)) // len("noise\n")  # whole lines of the last 2000 chars
    error = "exited 3: " + " | ".join(["noise"] * kept_noise + traceback.replace("  ", "").splitlines())
    assert [o.error for o in outcomes] == [error, error]
    assert sorted(logged) == [f"agent for task 1: {error}", f"agent for task 2: {error}"]


FUNCTIONS = '''
import asyncio, json, os

async def agent(client, task, model):
    kind = task["kind"]
    if kind == "reward":
        assert str(client.base_url) == os.environ["EXPECTED_BASE_URL"] + "/", client.base_url
        assert client.api_key == "ep-reward" and client.max_retries == 0 and model == "omrl-policy"
        return 0.5
    if kind == "none":
        return None
    if kind == "raise":
        json.loads("the door is locked")
    if kind == "not a number":
        return "0.5"
    if kind == "nan":
        return float("nan")
    await asyncio.sleep(1000)  # hangs

async def two_args(client, task):
    with open(os.environ["PIDS"], "w") as f:
        f.write("started")
    await asyncio.sleep(1000)

def not_async(client, task):
    return 1.0
'''


@pytest.fixture
def functions_module(tmp_path, monkeypatch):
    """A module of agent functions importable as ``omrl_test_agent_fns``."""
    (tmp_path / "omrl_test_agent_fns.py").write_text(FUNCTIONS)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "omrl_test_agent_fns", raising=False)
    monkeypatch.setenv("EXPECTED_BASE_URL", BASE_URL)
    return "omrl_test_agent_fns"


def test_function_agents_return_rewards_and_errors_one_line_each(functions_module):
    kinds = ["reward", "none", "raise", "not a number", "nan", "hang"]
    logged = []
    outcomes = run_agents([AgentJob(f"ep-{k}", {"task_id": i, "kind": k}) for i, k in enumerate(kinds)],
                          _cfg(function=f"{functions_module}:agent", timeout_s=1), BASE_URL, "omrl-policy",
                          logged.append)
    assert [(o.key, o.reward, o.error) for o in outcomes] == [
        ("ep-reward", 0.5, None),
        ("ep-none", None, None),
        ("ep-raise", None, "raised JSONDecodeError: Expecting value: line 1 column 1 (char 0)"),
        ("ep-not a number", None, "returned '0.5' (str), not a finite number or None"),
        ("ep-nan", None, "returned nan (float), not a finite number or None"),
        ("ep-hang", None, "timed out after 1s (cancelled)"),
    ]
    assert outcomes[-1].seconds >= 1.0
    assert len(logged) == 4 and all("\n" not in line for line in logged)
    [raised] = [line for line in logged if line.startswith("agent for task 2: ")]
    assert raised.startswith("agent for task 2: raised JSONDecodeError: Expecting value: line 1 column 1 (char 0); at ")
    assert raised.endswith("omrl_test_agent_fns.py:13 in agent")  # the agent's line, not json's


@pytest.mark.parametrize("kind", ["command", "function"])
def test_abandon_stops_every_running_agent(kind, tmp_path, monkeypatch, functions_module):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))
    cfg = (_cfg(command=_agent(tmp_path, HANGING), max_concurrent=1) if kind == "command"
           else _cfg(function=f"{functions_module}:two_args", max_concurrent=1))
    asked: list[float] = []

    def abandon() -> bool:  # once the first agent runs
        if pids.exists() and not asked:
            asked.append(time.monotonic())
        return bool(asked)

    outcomes = run_agents([AgentJob("running", {}), AgentJob("waiting", {})], cfg, BASE_URL, "m", print, abandon)
    assert [(o.key, o.reward, o.error) for o in outcomes] == [("running", None, "abandoned"),
                                                             ("waiting", None, "abandoned")]
    assert time.monotonic() - asked[0] < agents.KILL_GRACE_S  # the agent dies on SIGTERM: no wait for the grace
    if kind == "command":
        [[agent_pid, sleep_pid]] = [pids_in(pids)]  # the waiting agent never started
        assert not alive(agent_pid) and not alive(sleep_pid)


def test_an_exception_in_the_caller_leaves_no_agent_running(tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PIDS", str(pids))

    def abandon() -> bool:
        if pids.exists():
            raise RuntimeError("the trainer failed")
        return False

    with pytest.raises(RuntimeError, match="the trainer failed"):
        run_agents([AgentJob("k", {})], _cfg(command=_agent(tmp_path, HANGING)), BASE_URL, "m", print, abandon)
    [[agent_pid, sleep_pid]] = [pids_in(pids)]
    assert wait_for(lambda: not alive(agent_pid) and not alive(sleep_pid), within=1.0)


def test_agents_die_when_the_process_running_them_is_killed_with_sigkill(tmp_path):
    pids = tmp_path / "pids"
    launcher = textwrap.dedent(f"""
        from types import SimpleNamespace
        from openmanus_rl_core.gateway.agents import AgentJob, run_agents
        cfg = SimpleNamespace(command={_agent(tmp_path, HANGING)!r}, function=None, max_concurrent=4, timeout_s=600)
        run_agents([AgentJob("a", {{}}), AgentJob("b", {{}})], cfg, {BASE_URL!r}, "m", print)
    """)
    proc = subprocess.Popen([sys.executable, "-c", launcher], env={**os.environ, "PIDS": str(pids)})
    try:
        assert wait_for(lambda: len(pids_in(pids)) == 4, within=5.0), "the agents did not start"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=5)
        assert wait_for(lambda: not any(alive(p) for p in pids_in(pids)), within=3.0), \
            [p for p in pids_in(pids) if alive(p)]
    finally:
        for pid in pids_in(pids):  # only if the test failed
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_check_agent_accepts_a_found_program_and_an_async_function(functions_module):
    check_agent(_cfg(command=f"{shlex.quote(sys.executable)} -c 'print(1)'"))
    check_agent(_cfg(command="sh -c true"))
    check_agent(_cfg(function=f"{functions_module}:agent"))


@pytest.mark.parametrize("fields, message", [
    ({}, "agent: set exactly one of agent.command (a program run once per episode) and agent.function "
         "(pkg.mod:fn, an async fn(client, task)); neither is set"),
    ({"command": "python a.py", "function": "m:fn"},
     "agent: set exactly one of agent.command (a program run once per episode) and agent.function "
     "(pkg.mod:fn, an async fn(client, task)); both are set ('python a.py', 'm:fn')"),
    ({"command": "nosuch --x"},
     "agent.command='nosuch --x': the program 'nosuch' is not found on PATH; install it or give its path"),
    ({"command": "python 'a.py"}, "agent.command=\"python 'a.py\": cannot be split into shell words: "
                                  "No closing quotation"),
    ({"command": "  "}, "agent.command='  ': names no program; give the program to run once per episode"),
    ({"function": "omrl_no_such_module:fn"}, "agent.function='omrl_no_such_module:fn': cannot be imported: "
                                             "ModuleNotFoundError: No module named 'omrl_no_such_module'"),
    ({"function": "json:no_such_fn"}, "agent.function='json:no_such_fn': cannot be imported: AttributeError: "
                                      "module 'json' has no attribute 'no_such_fn'"),
    ({"function": "json.dumps"}, "agent.function='json.dumps': expected pkg.mod:fn, an async fn(client, task) -> "
                                 "reward | None"),
    ({"function": "json:dumps"}, "agent.function='json:dumps': is not an async function (define it as async def "
                                 "fn(client, task))"),
])
def test_check_agent_refuses_in_one_line_naming_the_value(fields, message):
    with pytest.raises(ConfigError) as info:
        check_agent(_cfg(**fields))
    assert str(info.value) == message


def test_check_agent_refuses_a_missing_or_non_executable_program_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agent.sh").write_text("#!/bin/sh\n")
    with pytest.raises(ConfigError) as info:
        check_agent(_cfg(command="./missing.sh --fast"))
    assert str(info.value) == (f"agent.command='./missing.sh --fast': the program './missing.sh' is not found "
                               f"(relative paths start at {tmp_path})")
    with pytest.raises(ConfigError) as info:
        check_agent(_cfg(command="./agent.sh"))
    assert str(info.value) == ("agent.command='./agent.sh': the program './agent.sh' is not executable; chmod +x "
                               "it, or run it through its interpreter (agent.command=\"python ./agent.sh\")")
    (tmp_path / "agent.sh").chmod(0o755)
    check_agent(_cfg(command="./agent.sh"))
