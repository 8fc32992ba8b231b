"""The AgentGym HTTP client and launcher against real FastAPI servers (tests/fake_agentgym_server.py) run as
subprocesses on free ports; every server is stopped when its test or module ends."""

from __future__ import annotations

import os
import pickle
import random
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from omegaconf import OmegaConf

from openmanus_rl_core.protocols import Env, StepResult
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_env_agentgym import (
    AgentGymEnv,
    EnvServerError,
    LauncherError,
    ServerLauncher,
    env_names,
    get_spec,
)
from openmanus_rl_env_agentgym import launcher as launcher_module
from openmanus_rl_env_agentgym.factories import make_env

FAKE = str(Path(__file__).with_name("fake_agentgym_server.py"))
AGENTGYM_ENVS = {"academia", "alfworld", "babyai", "maze", "wordle", "movie", "sciworld", "sheet", "sqlgym",
                 "textcraft", "todo", "weather", "webarena", "webshop"}
PKG = Path(__import__("openmanus_rl_env_agentgym").__file__).parent


# --------------------------------------------------------------------------------------------- helpers
def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_base_port(n: int = 1) -> int:
    """A port p with p .. p+n-1 all free right now."""
    rng = random.Random()
    for _ in range(200):
        base = rng.randint(20000, 60000)
        if all(_port_free(base + i) for i in range(n)):
            return base
    raise RuntimeError("no free ports")


def fake_command(shape: str, *extra: str) -> list[str]:
    return ["{python}", FAKE, "--port", "{port}", "--shape", shape, *extra]


def fake_launcher(shape: str, *extra: str, num_servers: int = 1, **kw) -> ServerLauncher:
    return ServerLauncher(fake_command(shape, *extra), num_servers=num_servers, base_port=free_base_port(num_servers),
                          health_timeout=30, name=f"fake-{shape}", **kw)


def play(env: AgentGymEnv, task_id: int, actions=("look", "inc", "inc", "inc")) -> tuple[str, list[StepResult]]:
    first = env.reset(task_id)
    results = []
    for a in actions:
        results.append(env.step(a))
        if results[-1].done:
            break
    return first, results


@pytest.fixture(scope="module")
def id_server():
    with fake_launcher("id", "--chaos") as servers:
        yield servers


@pytest.fixture(scope="module")
def env_idx_server():
    with fake_launcher("env_idx", "--chaos") as servers:
        yield servers


@pytest.fixture
def textcraft(id_server):
    """TextCraft's spec (id shape, index key data_idx) pointed at the fake id-shape server."""
    env = AgentGymEnv("textcraft", base_url=id_server.urls[0], timeout=5, retries=1)
    yield env
    env.close()


# ----------------------------------------------------------------------------------- spec and wiring
def test_every_agentgym_env_has_a_spec_an_entry_point_and_a_config():
    assert set(env_names()) == AGENTGYM_ENVS
    installed = set(registry("env").names())
    assert {f"agentgym_{n}" for n in AGENTGYM_ENVS} <= installed
    for name in AGENTGYM_ENVS:
        spec = get_spec(name)
        assert spec.protocol in ("id", "env_idx") and spec.command and "{port}" in spec.command
        env = registry("env").build(f"agentgym_{name}")  # lazy: no server needed until reset
        assert isinstance(env, AgentGymEnv) and isinstance(env, Env)
        assert env.spec.name == name and env.num_tasks == spec.num_tasks and env.instruction
        assert spec.num_tasks is None or spec.num_tasks > 0  # None: the server accepts any index
        env.close()

        cfg = OmegaConf.load(PKG / "configs" / "env" / f"agentgym_{name}.yaml")
        assert cfg.name == f"agentgym_{name}"
        kwargs = OmegaConf.to_container(cfg.kwargs, resolve=True)
        assert kwargs["launcher"]["command"] == spec.command
        assert kwargs["launcher"]["base_port"] == kwargs["base_port"]
        assert cfg.num_tasks == (spec.num_tasks or cfg.num_tasks) and cfg.train_tasks >= 1 and cfg.max_turns >= 1
        built = registry("env").build(cfg.name, **kwargs)  # the config's kwargs are accepted as they are
        assert built.base_url == f"http://127.0.0.1:{kwargs['base_port']}"
        built.close()


def test_protocols_come_from_the_spec_and_can_be_switched():
    assert get_spec("textcraft").id_key == "id" and get_spec("textcraft").create_id_path == "id"
    assert get_spec("webshop").id_key == "env_idx" and get_spec("webshop").create_id_path == ""
    assert get_spec("webarena").create_id_path == "env_idx"  # its /create answers {"env_idx": n}
    switched = get_spec("textcraft", protocol="env_idx")
    assert (switched.id_key, switched.create_id_path, switched.reset_index_key) == ("env_idx", "", "data_idx")
    with pytest.raises(ValueError, match="protocol"):
        get_spec("textcraft", protocol="grpc")
    with pytest.raises(KeyError, match="textcraft"):
        get_spec("textcraf")
    with pytest.raises(ValueError, match="unknown spec field"):
        AgentGymEnv("textcraft", spec={"obsrevation": "x"})


def test_task_ids_map_into_the_data_range():
    env = AgentGymEnv("maze", port=1)
    assert env.num_tasks == 26 and env._data_index(25, None) == 25 and env._data_index(None, 27) == 1
    with pytest.raises(ValueError, match=r"outside \[0, 26\)"):
        env._data_index(26, None)
    shifted = AgentGymEnv("maze", port=1, data_range=[100, 110])
    assert shifted.num_tasks == 10 and shifted._data_index(3, None) == 103


def test_hooks_contribute_the_config_dir():
    from openmanus_rl_env_agentgym import hooks

    (path,) = hooks.openmanus_rl_config_dirs()
    assert {p.stem for p in (Path(path) / "env").glob("*.yaml")} == {f"agentgym_{n}" for n in AGENTGYM_ENVS}


def canned(env: AgentGymEnv, answers: dict) -> list:
    """Answer the env's requests from ``answers[path]`` (a list is consumed in order); returns the calls made."""
    calls = []

    def request(method, path, body=None, *, params=None, **_):
        calls.append((method, path, body, params))
        answer = answers[path]
        return answer.pop(0) if isinstance(answer, list) and answer and isinstance(answer[0], _Seq) else answer

    env._request = request
    return calls


class _Seq(dict):
    """One answer of a sequence in ``canned``."""


def test_answer_shapes_of_the_real_servers():
    # SciWorld: first observation = task description + observation; scores 0..100 scaled to 0..1, per step.
    env = AgentGymEnv("sciworld", port=1)
    calls = canned(env, {"/create": {"id": 3}, "/reset": {"task_description": "Boil water.", "observation": "Kitchen.",
                                                          "reward": 0, "score": 0, "done": False},
                         "/step": [_Seq(observation="a", reward=25, score=25, done=False),
                                   _Seq(observation="b", reward=75, score=100, done=True)]})
    assert env.reset(5) == "Boil water.\nKitchen."
    assert calls[1] == ("POST", "/reset", {"id": 3, "data_idx": 5}, None)
    first, last = env.step("look around"), env.step("focus on water")
    assert (first.reward, last.reward, last.done, last.info["success"]) == (0.25, 0.75, True, True)
    assert calls[2] == ("POST", "/step", {"id": 3, "action": "look around"}, None)
    assert last.info["server_info"] == {"score": 100}

    # BabyAI: "reward" is the best progress so far; the client reports the per-step gain.
    env = AgentGymEnv("babyai", port=1)
    canned(env, {"/create": {"id": 0}, "/reset": {"observation": "Your goal: go to the red ball", "reward": 0,
                                                  "score": 0, "done": False},
                 "/step": [_Seq(observation="x", reward=0.5, score=0.5, done=False),
                           _Seq(observation="y", reward=0.5, score=1.0, done=False),
                           _Seq(observation="z", reward=1.0, score=2.0, done=True)]})
    env.reset(0)
    assert [env.step("move forward").reward for _ in range(3)] == [0.5, 0.0, 0.5]

    # ALFWorld: the available actions follow the observation; reset carries game and world_type.
    env = AgentGymEnv("alfworld", port=1)
    calls = canned(env, {"/create": {"id": 0}, "/reset": {"observation": "A room.",
                                                          "available_actions": ["go to desk 1", "look"]},
                         "/step": {"observation": "Nothing happens.", "reward": 0, "done": False}})
    assert env.reset(7) == "A room.\nAVAILABLE ACTIONS: go to desk 1, look"
    assert calls[1][2] == {"id": 0, "game": 7, "world_type": "Text"}
    assert env.step("jump").observation == "Nothing happens.\nAVAILABLE ACTIONS: "

    # The tool envs (env_idx shape): /create takes {"id"} and answers an int; /reset answers the observation text.
    env = AgentGymEnv("academia", port=1)
    calls = canned(env, {"/create": 4, "/reset": "Now new trial starts.",
                         "/step": {"observation": "Observation: loaded", "reward": 0.5, "done": False}})
    assert env.reset(2) == "Now new trial starts."
    assert calls[0][2] == {"id": 0} and calls[1][2] == {"env_idx": 4, "id": 2}
    assert env.step("Action: loadPaperNet with Action Input: {}").reward == 0.5

    # SQLGym: /reset answers [observation, null]; the step's observation is "state" (any JSON becomes text).
    env = AgentGymEnv("sqlgym", port=1)
    calls = canned(env, {"/create": 0, "/reset": ["Which team won?", None],
                         "/step": {"state": [["Lakers"]], "reward": 1, "done": True, "info": {}}})
    assert env.reset(9) == "Which team won?" and calls[1][2] == {"env_idx": 0, "item_id": 9}
    result = env.step("SELECT team FROM games")
    assert (result.observation, result.done, result.info["success"]) == ('[["Lakers"]]', True, True)

    # WebArena: /create answers {"env_idx": n}; an episode ends on terminated or truncated.
    env = AgentGymEnv("webarena", port=1)
    calls = canned(env, {"/create": {"env_idx": 0}, "/reset": {"observation": "tree"},
                         "/step": {"observation": "tree 2", "reward": 0.0, "terminated": False, "truncated": True}})
    env.reset(11)
    assert calls[1][2] == {"env_idx": 0, "idx": 11, "seed": 0}
    assert env.step("click [3]").done is True

    # WebShop: the first observation comes from GET /observation.
    env = AgentGymEnv("webshop", port=1)
    calls = canned(env, {"/create": 12, "/reset": ["ignored", None], "/observation": "WebShop [SEP] Search"})
    assert env.reset(3) == "WebShop [SEP] Search" and calls[-1] == ("GET", "/observation", None, {"env_idx": 12})

    # A missing observation or a non-numeric reward is a server error, not a crash.
    env = AgentGymEnv("textcraft", port=1)
    canned(env, {"/create": {"id": 0}, "/reset": {"obs": "?"}})
    with pytest.raises(EnvServerError, match="no observation at 'observation'"):
        env.reset(0)
    env = AgentGymEnv("textcraft", port=1)
    canned(env, {"/create": {"id": 0}, "/reset": {"observation": "o"},
                 "/step": {"observation": "o", "reward": "lots", "done": False}})
    env.reset(0)
    with pytest.raises(EnvServerError, match="not a finite number"):
        env.step("get 1 stick")


# --------------------------------------------------------------------------------- both request shapes
def test_id_shape_episode_end_to_end(textcraft):
    first, results = play(textcraft, 2)
    assert first == "Task 2: count up to 3. Actions: inc, look. You are at 0."
    assert [r.done for r in results] == [False, False, False, True]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert results[-1].info["success"] is True and results[-1].info["score"] == 1.0
    assert results[-1].observation == "You reached 3. Task complete."
    # Same task, same first observation; and a finished episode answers with the server's error body.
    with pytest.raises(EnvServerError, match="has finished"):
        textcraft.step("inc")
    assert textcraft.reset(2) == first
    assert textcraft.observe() == first


def test_env_idx_shape_episode_end_to_end(env_idx_server):
    # WebShop's spec: create answers a bare int, reset answers [obs, null] and the client reads GET /observation,
    # step answers {"state", ...}, and the server has /close. The fake's reward is a running progress score.
    url = env_idx_server.urls[0]
    env = AgentGymEnv("webshop", base_url=url, timeout=5, spec={"reward_cumulative": True})
    first, results = play(env, 2, ("inc", "look", "inc", "inc"))
    assert first == "Task 2: count up to 3. Actions: inc, look. You are at 0."
    assert [r.done for r in results] == [False, False, False, True]
    assert [round(r.reward, 6) for r in results] == [0.333333, 0.0, 0.333333, 0.333333]
    assert results[-1].info["score"] == 1.0 and results[-1].info["success"] is True
    env_id = env._env_id
    assert requests.get(f"{url}/observation", params={"env_idx": env_id}).json() == "You are at 3."
    env.close()
    env.close()
    assert "error" in requests.get(f"{url}/observation", params={"env_idx": env_id}).json()  # /close freed it
    assert env.reset(1) == "Task 1: count up to 2. Actions: inc, look. You are at 0."  # usable again after close
    env.close()


def test_prefix_and_index_key_come_from_the_spec():
    # Maze: LMRL-Gym serves it under /maze and resets with {"id", "game"}; a base_url ending in /maze/ works too.
    with fake_launcher("id", "--prefix", "/maze") as servers:
        for base in (servers.urls[0], servers.urls[0] + "/maze/"):
            env = AgentGymEnv("maze", base_url=base, timeout=5)
            assert env.url == servers.urls[0] + "/maze"
            _, results = play(env, 0, ("inc",))
            assert results[-1].done and results[-1].reward == 1.0
            env.close()


# -------------------------------------------------------------------------------------- error answers
def test_error_body_raises_and_the_next_reset_recovers(textcraft):
    textcraft.reset(0)
    with pytest.raises(EnvServerError) as err:
        textcraft.step("__error__")
    text = str(err.value)
    assert "textcraft" in text and textcraft.url + "/step" in text and "broke on purpose" in text
    assert err.value.env_name == "textcraft" and err.value.url == textcraft.url + "/step"
    shipped = pickle.loads(pickle.dumps(err.value))  # Ray moves exceptions between processes
    assert str(shipped) == text and shipped.url == err.value.url
    with pytest.raises(EnvServerError, match="reset"):
        textcraft.step("inc")  # the episode is over after a server error
    _, results = play(textcraft, 0, ("inc",))
    assert results[-1].reward == 1.0


def test_hang_beyond_the_timeout_raises(id_server):
    env = AgentGymEnv("textcraft", base_url=id_server.urls[0], timeout=0.5)
    env.reset(0)
    start = time.monotonic()
    with pytest.raises(EnvServerError, match="timeout"):
        env.step("__hang__ 5")
    assert time.monotonic() - start < 3
    env.close()


@pytest.mark.parametrize("action, match", [("__garbage__", "not JSON"), ("__500__", "HTTP 500")])
def test_garbage_and_server_errors_raise(textcraft, action, match):
    textcraft.reset(0)
    with pytest.raises(EnvServerError, match=match):
        textcraft.step(action)


def test_http_503_is_retried(textcraft):
    textcraft.reset(1)
    for _ in range(2):  # the fake answers 503 on every other __flaky__ call; one retry gets through
        assert textcraft.step("__flaky__").observation == "You are at 0; the goal is 2."


def test_no_server_raises_connection_refused_with_the_url():
    port = free_base_port()
    env = AgentGymEnv("babyai", port=port, retries=1, retry_backoff=0.01)
    with pytest.raises(EnvServerError, match="connection refused") as err:
        env.reset(0)
    assert f"127.0.0.1:{port}/create" in str(err.value) and "babyai" in str(err.value)
    env.close()  # never raises
    shop = AgentGymEnv("webshop", port=port, retries=0)
    shop._env_id = 7  # pretend an episode ran: close() tries /close and swallows the failure
    shop.close()


# ------------------------------------------------------------------------------- server death, launcher
def test_killed_server_errors_then_the_launcher_restarts_it():
    servers = fake_launcher("id", num_servers=2)
    with servers:
        assert servers.assign(5) == [servers.urls[i % 2] for i in range(5)]
        assert [servers.next_base_url() for _ in range(4)] == servers.urls * 2
        port = servers.ports[0]
        env = AgentGymEnv("textcraft", base_url=servers.url(port), timeout=5, retries=1, retry_backoff=0.01)
        env.reset(2)
        env.step("inc")
        old_pid = servers.pid(port)
        os.killpg(old_pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while servers.is_alive(port) and time.monotonic() < deadline:
            time.sleep(0.05)
        with pytest.raises(EnvServerError, match="connection"):
            env.step("inc")
        env.close()

        assert servers.ensure_alive(port) is True and servers.ensure_alive(port) is False
        assert servers.pid(port) != old_pid
        fresh = AgentGymEnv("textcraft", base_url=servers.url(port), timeout=5)
        assert play(fresh, 1)[1][-1].info["success"] is True
        fresh.close()

        # The watchdog restarts a dead server by itself.
        servers.start_watchdog(interval=0.1)
        second = servers.ports[1]
        killed = servers.pid(second)
        os.killpg(killed, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            pid = servers.pid(second)
            if pid not in (None, killed) and servers.healthy(second):
                break
            time.sleep(0.1)
        else:
            pytest.fail("the watchdog did not restart the killed server")
        other = AgentGymEnv("textcraft", base_url=servers.url(second), timeout=5)
        assert play(other, 0)[1][-1].reward == 1.0
        other.close()
        pids = [servers.pid(p) for p in servers.ports]
    # Stopped on exit: the process groups are gone and the ports are free again.
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    assert all(not servers.healthy(p) for p in servers.ports)


def test_servers_stop_when_their_launcher_is_killed(tmp_path):
    """kill -9 of the launching process (no atexit, no stop()) still takes its servers down."""
    base = free_base_port(2)
    script = tmp_path / "launch.py"
    script.write_text(
        "import sys, time\n"
        "from openmanus_rl_env_agentgym.launcher import ServerLauncher\n"
        f"s = ServerLauncher({fake_command('id')!r}, num_servers=2, base_port={base}, health_timeout=30)\n"
        "s.start()\n"
        "print(*[s.pid(p) for p in s.ports], flush=True)\n"
        "time.sleep(600)\n"
    )
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(x) for x in proc.stdout.readline().split()]
        assert len(pids) == 2
        probe = ServerLauncher(fake_command("id"), num_servers=2, base_port=base)
        assert all(probe.healthy(p) for p in probe.ports)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and any(_group_alive(pid) for pid in pids):
            time.sleep(0.1)
        assert not any(_group_alive(pid) for pid in pids), "the servers outlived their launcher"
        assert not any(probe.healthy(p) for p in probe.ports)
        with ServerLauncher(fake_command("id"), num_servers=2, base_port=base, health_timeout=30) as again:
            assert all(again.healthy(p) for p in again.ports)  # the ports are free for a new run
    finally:
        proc.kill()
        for pid in pids if "pids" in locals() else []:
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def _group_alive(pgid: int) -> bool:
    """A running (not zombie) process is in process group ``pgid``."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] != "Z" and int(stat[2]) == pgid:  # fields after the name: state, ppid, pgrp
                return True
    return False


def test_launcher_reports_startup_failures():
    crash = ServerLauncher([sys.executable, "-c", "import sys; print('bad config'); sys.exit(4)"],
                           base_port=free_base_port(), health_timeout=10, name="crasher")
    with pytest.raises(LauncherError, match=r"exited with code 4[\s\S]*bad config"):
        crash.start()
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        with pytest.raises(LauncherError, match="already in use"):
            ServerLauncher(fake_command("id"), base_port=taken, name="clash").start()
    with pytest.raises(LauncherError, match="no start command"):
        ServerLauncher("", name="empty")
    slow = ServerLauncher([sys.executable, "-c", "import time; time.sleep(60)"], base_port=free_base_port(),
                          health_timeout=0.5, name="sleeper")
    with pytest.raises(LauncherError, match="did not answer"):
        slow.start()
    assert slow.pid(slow.ports[0]) is None  # a failed start stops what it started


def test_factories_round_robin_and_autostart():
    base = free_base_port(3)
    urls = [make_env("textcraft", base_port=base, num_servers=3).base_url for _ in range(4)]
    assert urls == [f"http://127.0.0.1:{base + i}" for i in (0, 1, 2, 0)]

    launcher_opts = {"command": fake_command("env_idx"), "health_timeout": 30, "num_servers": 99}
    env = registry("env").build("agentgym_webshop", base_port=base, num_servers=1, autostart=True, launcher=launcher_opts,
                                timeout=5)
    try:
        assert env.base_url == f"http://127.0.0.1:{base}"
        assert env.reset(0).startswith("Task 0")
        assert env.step("inc").done
        again = make_env("webshop", base_port=base, autostart=True, launcher=launcher_opts)
        assert again.base_url == env.base_url  # one shared launcher per process and server set
        again.close()
    finally:
        env.close()
        with launcher_module._SHARED_LOCK:
            shared = launcher_module._SHARED.pop(("webshop", "127.0.0.1", base, 1))
        shared.stop()
    assert not shared.healthy(base)


# ------------------------------------------------------------------------------ threads, kit, fuzzing
def test_concurrent_episodes_and_close_during_an_abandoned_step(id_server):
    url = id_server.urls[0]

    def episode(task: int) -> float:
        env = AgentGymEnv("textcraft", base_url=url, timeout=5)
        try:
            return sum(r.reward for r in play(env, task)[1])
        finally:
            env.close()

    with ThreadPoolExecutor(8) as pool:
        assert list(pool.map(episode, range(16))) == [1.0] * 16

        # One episode whose calls hop between pool threads (as the rollout's pool does): one session per thread.
        env = AgentGymEnv("textcraft", base_url=url, timeout=5)
        pool.submit(env.reset, 2).result()
        for _ in range(3):
            last = pool.submit(env.step, "inc").result()
        assert last.done and last.reward == 1.0
        env.close()

        # The rollout gives up on a hanging step and closes the env from another thread: close returns at once.
        env = AgentGymEnv("textcraft", base_url=url, timeout=2)
        env.reset(0)
        hung = pool.submit(env.step, "__hang__ 1.5")
        time.sleep(0.2)
        start = time.monotonic()
        env.close()
        assert time.monotonic() - start < 1
        try:
            hung.result(timeout=5)
        except EnvServerError:
            pass  # allowed: the only exception type step raises


def test_conformance_kit_on_a_live_server(id_server, env_idx_server):
    from openmanus_rl_core.testing import check_env

    check_env(lambda: AgentGymEnv("textcraft", base_url=id_server.urls[0], timeout=10), task_ids=[0, 1],
              actions=["inc", "look", "inc"])
    check_env(lambda: AgentGymEnv("webshop", base_url=env_idx_server.urls[0], timeout=10), task_ids=[0, 2],
              actions=["inc", "look"])


@pytest.mark.parametrize("shape", ["id", "env_idx"])
def test_arbitrary_action_text_never_breaks_the_server(shape, id_server, env_idx_server):
    url = (id_server if shape == "id" else env_idx_server).urls[0]
    env = AgentGymEnv("textcraft" if shape == "id" else "webshop", base_url=url, timeout=10)
    env.reset(0)
    state = {"steps": 0}

    @settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
    @given(st.text(max_size=400) | st.binary(max_size=200).map(lambda b: b.decode("latin-1")))
    def step_any(text):
        if text.strip().lower() == "inc" or text.startswith("__"):
            text = "x" + text  # keep the episode going and stay clear of the fake's chaos actions
        try:
            result = env.step(text)
        except EnvServerError as exc:  # allowed by the contract; the fake server must never need it
            pytest.fail(f"healthy server raised for {text!r}: {exc}")
        assert isinstance(result, StepResult) and isinstance(result.observation, str)
        assert result.reward == 0.0
        state["steps"] += 1
        if result.done:
            env.reset(0)

    step_any()
    assert state["steps"] >= 1 and env.healthy()
    env.close()
