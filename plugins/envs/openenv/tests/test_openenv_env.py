"""env=openenv against openenv-core's own server: the Words env (``openenv_words/``, written with openenv-core's
``Environment``, ``Rubric`` and ``create_app``, pip-installed for real with its ``openenv.yaml``) served by the plugin
from its package, and reached by ``env.kwargs.url`` on a server started as a user starts one (uvicorn). Also: the
action and observation text against real pydantic Action models, sessions and servers (a single-session env gets a
server per session), a server killed mid-rollout, no server left after the driver stops or is killed -9, bad input
stopped before anything starts, and 3 training steps from the command line."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
from pathlib import Path
from typing import List, Literal, Optional

import pytest

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.envs import EnvUnavailableError
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.protocols import Generation
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig

from openmanus_rl_env_openenv import OpenEnvEnv, schema as sc
from openmanus_rl_env_openenv import env as env_module
from openmanus_rl_env_openenv.servers import healthy
from openenv_testing import (BIN, WORDS, UserServer, alive, children, free_port, listening, wait_for,
                             words_package)

assert words_package  # a fixture, used by name below


def word_of(task_id: int) -> str:
    """The word of a task id, as the Words env's own reset(seed=task_id) picks it."""
    return random.Random(task_id).choice(WORDS)


def kwargs_of(*overrides: str) -> dict:
    """env.kwargs of env=openenv as the config composes and checks them (the yaml's values, the given overrides)."""
    cfg = load(["env=openenv", *overrides], training=False)
    return dict(cfg.env.kwargs)


# ------------------------------------------------------------------------------- the action and observation text
def _models():
    from openenv.core.env_server.types import Action
    from pydantic import Field

    class Move(Action):
        piece: Literal["pawn", "king"] = Field(description="which piece")
        to: str = Field(description="the square, e.g. e4")
        promote: Optional[int] = None

    class Count(Action):
        n: int = Field(description="how many")

    class Ratio(Action):
        x: float

    class Flag(Action):
        on: bool

    class Many(Action):
        ids: List[int]

    class Maybe(Action):
        k: Optional[int]

    class Say(Action):
        text: str
        loud: bool = False

    return Move, Count, Ratio, Flag, Many, Maybe, Say


def test_the_prompt_shows_each_field_its_type_and_description_and_how_to_write_the_action():
    Move, Count, *_ = _models()
    fields = sc.action_fields(Move.model_json_schema())
    assert [f.name for f in fields] == ["piece", "to", "promote"]  # metadata (every Action has it) is left out
    assert sc.describe_action("Move", fields).splitlines() == [
        "Your action is the env's Move, with these fields:",
        '- piece (one of "pawn", "king", required): which piece',
        "- to (string, required): the square, e.g. e4",
        "- promote (integer or null, optional)",
        'Write the action as a JSON object of its fields, e.g. {"piece": ..., "to": ...}.']
    count = sc.describe_action("Count", sc.action_fields(Count.model_json_schema()))
    assert count.endswith('e.g. {"n": ...}; or write the value of n alone, as plain text.')
    assert "- n (integer, required): how many" in count


@pytest.mark.parametrize("model, reply, payload", [
    ("Count", "42", {"n": 42}), ("Count", " -7 \n", {"n": -7}), ("Ratio", "0.25", {"x": 0.25}),
    ("Flag", "yes", {"on": True}), ("Flag", "False", {"on": False}), ("Many", "[1, 2]", {"ids": [1, 2]}),
    ("Maybe", "3", {"k": 3}), ("Say", "hello there", {"text": "hello there"}),
    ("Say", '{"text": "hi", "loud": true}', {"text": "hi", "loud": True}),
    ("Say", '{"a": 1}', {"text": '{"a": 1}'}),  # a JSON object naming none of its fields is the text itself
])
def test_a_reply_becomes_the_action_its_model_accepts(model, reply, payload):
    cls = {c.__name__: c for c in _models()}[model]
    action_schema = cls.model_json_schema()
    got, why = sc.to_action(reply, action_schema, sc.action_fields(action_schema))
    assert (got, why) == (payload, "")
    cls.model_validate(got)  # openenv-core's own Action model takes it


def test_a_reply_that_gives_no_action_or_a_wrong_type_is_answered_not_raised():
    Move, Count, *_ = _models()
    move = Move.model_json_schema()
    got, why = sc.to_action("e4", move, sc.action_fields(move))
    assert got is None
    assert why == 'Invalid action: write it as a JSON object with the fields "piece", "to" (got \'e4\').'
    count = Count.model_json_schema()
    got, _ = sc.to_action("seven", count, sc.action_fields(count))
    assert got == {"n": "seven"}  # not an integer: sent as written, the server's validation answers it
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as caught:
        Count.model_validate(got)
    assert sc.validation_message(caught.value.errors()) == (
        "Invalid action: n: Input should be a valid integer, unable to parse string as an integer.")


def test_an_observation_reads_as_name_value_lines_or_one_field():
    obs = {"prompt": "Say it", "board": [[1, 0], [0, 1]], "score": 0.5}
    assert sc.observation_text(obs) == "prompt: Say it\nboard: [[1, 0], [0, 1]]\nscore: 0.5"
    assert sc.observation_text(obs, "board") == "[[1, 0], [0, 1]]"


# ------------------------------------------------------------------------------- served from its package
@pytest.fixture(scope="module")
def served(words_package):
    service = OpenEnvEnv.serve(**kwargs_of(f"env.kwargs.package={words_package}", "env.kwargs.sessions=4"))
    yield service
    service.close()


def test_served_from_its_package_the_episode_is_the_envs_own_with_its_rubric_reward(served):
    from omrl_words_env.server.environment import WordsEnvironment  # the installed package, called in process

    kwargs = served.kwargs
    assert kwargs["package"] is None and len(kwargs["url"]) == 1  # one server holds the 4 sessions (it has 8)
    (url,) = kwargs["url"]
    assert url.startswith("http://127.0.0.1:") and healthy(url)
    env = OpenEnvEnv(**kwargs)
    for task_id in (0, 5, 11):
        first = env.reset(task_id=task_id)
        own = WordsEnvironment().reset(seed=task_id)
        assert first == f"prompt: {own.prompt}\nattempts_left: 3" == (f"prompt: Say the word: {word_of(task_id)}\n"
                                                                       "attempts_left: 3")
    env.reset(task_id=5)
    miss = env.step("banana")
    assert (miss.observation, miss.reward, miss.done, miss.info) == (
        f"prompt: Wrong. Say the word: {word_of(5)}\nattempts_left: 2", 0.0, False, {"openenv_reward": 0.0})
    typed = env.step('{"word": 5}')  # the server's pydantic model refuses it: an invalid action, the episode goes on
    assert (typed.observation, typed.reward, typed.done, typed.info) == (
        "Invalid action: word: Input should be a valid string.", 0.0, False, {"invalid": True})
    extra = env.step('{"word": "stone", "volume": 11}')
    assert extra.observation == "Invalid action: volume: Extra inputs are not permitted." and extra.info["invalid"]
    hit = env.step(json.dumps({"word": word_of(5)}))
    assert (hit.observation, hit.reward, hit.done, hit.info) == (
        "prompt: Right.\nattempts_left: 1", 1.0, True, {"openenv_reward": 1.0})  # the invalid ones cost no attempt
    after = env.step("anything")
    assert (after.observation, after.done, after.info) == ("The episode is over.", True, {"invalid": True})
    env.close()
    assert env.instruction.splitlines() == [
        "OpenEnv environment WordsEnvironment.",
        "Your action is the env's WordAction, with these fields:",
        "- word (string, required): the word to say",
        'Write the action as a JSON object of its fields, e.g. {"word": ...}; or write the value of word alone, '
        "as plain text."]


def test_obs_field_and_success_reward(served):
    env = OpenEnvEnv(**{**served.kwargs, "obs_field": "prompt", "success_reward": 1.0})
    assert env.reset(task_id=2) == f"Say the word: {word_of(2)}"
    assert env.step(word_of(2)).info == {"openenv_reward": 1.0, "success": True}
    env.reset(task_id=2)
    results = [env.step("nope") for _ in range(3)]
    assert [r.done for r in results] == [False, False, True] and results[-1].info["success"] is False
    assert "success" not in results[0].info
    env.close()
    with pytest.raises(EnvUnavailableError, match=r"^env\.kwargs\.obs_field=promt: the env's observation has no "
                                                  r"such field \(its fields: prompt, attempts_left\)$"):
        OpenEnvEnv.serve(**{**served.kwargs, "obs_field": "promt"})


def test_the_conformance_kit(served):
    from openmanus_rl_core.testing import check_env

    check_env(lambda: OpenEnvEnv(**served.kwargs), task_ids=[0, 1], actions=["apple", '{"word": "river"}'])


# ------------------------------------------------------------------------------- reached by env.kwargs.url
def test_reached_by_url_on_a_server_the_user_runs(words_package):
    server = UserServer(sessions=2)
    try:
        kwargs = kwargs_of(f"env.kwargs.url={server.url}", "env.kwargs.sessions=2")
        service = OpenEnvEnv.serve(**kwargs)
        assert service.kwargs == kwargs  # nothing started: every env reaches the user's server
        envs = [OpenEnvEnv(**service.kwargs) for _ in range(2)]
        assert [e.reset(task_id=t) for t, e in enumerate(envs)] == [
            f"prompt: Say the word: {word_of(t)}\nattempts_left: 3" for t in range(2)]
        assert [e.step(word_of(t)).reward for t, e in enumerate(envs)] == [1.0, 1.0]
        for e in envs:
            e.close()
        service.close()
        assert healthy(server.url)  # the user's server is theirs: never stopped by the plugin
        with pytest.raises(EnvUnavailableError, match=r"the server\(s\) hold 2 session\(s\) at once, fewer than "
                                                      r"env\.kwargs\.sessions=3"):
            OpenEnvEnv.serve(**{**kwargs, "sessions": 3})
    finally:
        server.stop()


# ------------------------------------------------------------------------------- sessions and servers
def test_a_single_session_env_gets_one_server_per_session(words_package, monkeypatch):
    kwargs = kwargs_of(f"env.kwargs.package={words_package}", "env.kwargs.sessions=2",
                       "+env.kwargs.server_env.WORDS_SESSIONS=1")
    service = OpenEnvEnv.serve(**kwargs)
    try:
        urls = service.kwargs["url"]
        assert len(urls) == 2 and len(set(urls)) == 2
        envs = [OpenEnvEnv(**service.kwargs) for _ in range(3)]
        results = [None] * 2
        threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, envs[i].reset(task_id=i)))
                   for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [f"prompt: Say the word: {word_of(i)}\nattempts_left: 3" for i in range(2)]
        assert sorted(e._session._ws_url for e in envs[:2]) == sorted(u.replace("http", "ws") + "/ws" for u in urls)
        monkeypatch.setattr(env_module, "SESSION_WAIT_S", 0.5)  # how long a reset looks for a free session
        with pytest.raises(RuntimeError, match=r"every session of the env's 2 server\(s\) is in use: .*"
                                               r"env\.kwargs\.sessions=2"):
            envs[2].reset(task_id=2)
        envs[0].close()  # its session is free again
        assert envs[2].reset(task_id=2).endswith("attempts_left: 3")
        for e in envs:
            e.close()
    finally:
        service.close()
    assert not any(listening(int(u.rsplit(":", 1)[1])) for u in urls)
    with pytest.raises(EnvUnavailableError, match=r"a server holds 1 session\(s\) at once, so env\.kwargs\.sessions=2 "
                                                  r"needs 2 servers, more than env\.kwargs\.max_servers=1"):
        OpenEnvEnv.serve(**{**kwargs, "max_servers": 1})


def test_two_session_servers_with_sessions_3_are_two_servers_and_3_episodes_reset_at_once(words_package):
    kwargs = kwargs_of(f"env.kwargs.package={words_package}", "env.kwargs.sessions=3",
                       "+env.kwargs.server_env.WORDS_SESSIONS=2")
    service = OpenEnvEnv.serve(**kwargs)
    try:
        urls = service.kwargs["url"]
        assert len(urls) == 2 and len(set(urls)) == 2  # ceil(3 / 2) servers
        envs = [OpenEnvEnv(**service.kwargs) for _ in range(3)]
        barrier = threading.Barrier(3)
        results: list = [None] * 3

        def reset(i: int) -> None:
            barrier.wait()
            try:
                results[i] = envs[i].reset(task_id=i)
            except Exception as exc:  # noqa: BLE001  (the assertion below names it)
                results[i] = exc

        threads = [threading.Thread(target=reset, args=(i,)) for i in range(3)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == [f"prompt: Say the word: {word_of(i)}\nattempts_left: 3" for i in range(3)]
        held = sorted(e._session._ws_url for e in envs)  # all three sessions open at once, over both servers
        assert sorted(set(held)) == sorted(u.replace("http", "ws") + "/ws" for u in urls)
        for e in envs:
            e.close()
    finally:
        service.close()


def test_sessions_unset_are_the_episodes_the_command_plays_at_once(words_package):
    from openmanus_rl_core.plugin.envs import open_env_service

    kwargs = kwargs_of(f"env.kwargs.package={words_package}", "+env.kwargs.server_env.WORDS_SESSIONS=2")
    assert kwargs["sessions"] is None
    service = open_env_service("openenv", OpenEnvEnv, kwargs, at_once=3)  # the command's 3 episodes: 2 servers
    try:
        assert len(service.kwargs["url"]) == 2 and service.kwargs["sessions"] == 3
    finally:
        service.close()
    service = open_env_service("openenv", OpenEnvEnv, {**kwargs, "sessions": 1}, at_once=3)  # a setting wins
    try:
        assert len(service.kwargs["url"]) == 1 and service.kwargs["sessions"] == 1
    finally:
        service.close()
    with pytest.raises(ValueError, match=r"^env\.kwargs\.sessions is not set and the command did not say how many "
                                         r"episodes it plays at once: set env\.kwargs\.sessions=<episodes at once>$"):
        OpenEnvEnv.serve(**kwargs)


def test_the_episodes_at_once_of_train_are_a_step_or_a_validation_whichever_is_larger():
    from openmanus_rl_core.run.setup import train_at_once

    def at_once(*overrides: str) -> int:
        return train_at_once(load(["env=key_door", *overrides], training=False))

    assert at_once("data.train_batch_size=4", "algorithm.n=2", "env.val_tasks=6") == 8
    assert at_once("data.train_batch_size=4", "algorithm.n=2", "env.val_tasks=20") == 20
    assert at_once("data.train_batch_size=4", "algorithm.n=2", "env.val_tasks=20", "trainer.val_max_tasks=5") == 8
    assert at_once("data.train_batch_size=4", "algorithm.n=2", "env.val_tasks=20", "trainer.val_freq=0",
                   "trainer.val_before_train=false", "trainer.val_at_end=false", "warmup.enabled=false") == 8
    assert at_once("data.train_batch_size=4", "algorithm.n=2", "env.val_tasks=6",
                   "rollout.max_staleness=2") == 24  # 3 batches in flight


def test_rollout_of_8_tasks_plays_on_a_64_session_server_without_a_sessions_setting(words_package, tmp_path,
                                                                                   command_here):
    server = UserServer(sessions=64)
    try:
        out = tmp_path / "out"
        proc = command_here(["rollout", "env=openenv", "reward=openenv", f"env.kwargs.url={server.url}",
                             "rollout.num_tasks=8", "rollout.n=1", f"rollout.output_dir={out}", "env.max_turns=1",
                             "rollout.max_new_tokens=8", "model.tiny.vocab_size=400", "model.corpus_tasks=8"])
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        assert "episodes: 8 (8 tasks x n=1)" in proc.stdout
        rows = [json.loads(x) for x in (out / "trajectories.jsonl").read_text().splitlines() if x.strip()]
        assert len(rows) == 8 and all(r["termination"] != "env_error" for r in rows)
    finally:
        server.stop()


# ------------------------------------------------------------------------------- a server killed mid-rollout
class KillingEngine:
    """Replies ``word`` to every prompt; its first generate call first kills ``-9`` the process given by ``kill``."""

    def __init__(self, tokenizer, template, reply, kill=None):
        self.tok, self.template, self.reply, self.kill = tokenizer, template, reply, kill

    def generate(self, prompts, params):
        if self.kill is not None:
            os.kill(self.kill, signal.SIGKILL)
            self.kill = None
        text = self.template.render(self.reply)
        ids = self.tok.encode(text, add_special_tokens=False)
        return [Generation(list(ids), [-0.1] * len(ids), text, "stop") for _ in prompts]

    def update_weights(self, state_dict):
        pass


def test_a_server_killed_mid_rollout_gives_env_error_episodes_and_is_restarted(words_package, tmp_path):
    template = registry("template").build("react")
    tokenizer = build_tokenizer([template.render(w) for w in WORDS] + ["prompt: Say the word:", "attempts_left"],
                                vocab_size=300)
    service = OpenEnvEnv.serve(**kwargs_of(f"env.kwargs.package={words_package}", "env.kwargs.sessions=4",
                                           f"env.kwargs.log_dir={tmp_path}"))
    try:
        pool = service.pool
        (guard,) = pool.pids()
        (server,) = children(guard)  # the guard's child: uvicorn serving the app
        cfg = RolloutConfig(max_turns=2, max_new_tokens=16, env_timeout_s=20)
        tasks = [{"task_id": t, "seed": None, "group_id": t} for t in range(4)]
        loop = AgentLoop(KillingEngine(tokenizer, template, "banana", kill=server), tokenizer, template,
                         lambda: OpenEnvEnv(**service.kwargs), cfg)
        episodes = loop.run(tasks)
        assert [e.trajectory.termination for e in episodes] == ["env_error"] * 4
        assert all("closed the session" in (e.trajectory.error or "") or "connect" in (e.trajectory.error or "")
                   for e in episodes), [e.trajectory.error for e in episodes]
        service.check()  # the run's env-error watch: waits for the watchdog's restart
        log = (tmp_path / f"openenv_{service.kwargs['url'][0].rsplit(':', 1)[1]}.log").read_text()
        assert log.count("=== starting") == 2
        assert service.kwargs["url"][0] in pool.urls and pool.pids() != [guard]
        again = AgentLoop(KillingEngine(tokenizer, template, "banana"), tokenizer, template,
                          lambda: OpenEnvEnv(**service.kwargs), cfg).run(tasks)
        assert [e.trajectory.termination for e in again] == ["max_turns"] * 4
        assert [t.observation for t in again[0].trajectory.turns] == [
            f"prompt: Wrong. Say the word: {word_of(0)}\nattempts_left: {n}" for n in (2, 1)]
    finally:
        service.close()
    assert not alive(server) and pool.pids() == []


# ------------------------------------------------------------------------------- no server left behind
def test_no_server_is_left_after_the_driver_is_killed_9(words_package, tmp_path):
    code = textwrap.dedent(f"""
        import json, time
        from openmanus_rl_env_openenv import OpenEnvEnv
        service = OpenEnvEnv.serve(package={words_package!r}, sessions=1, log_dir={str(tmp_path)!r})
        print(json.dumps({{"urls": service.kwargs["url"], "guards": service.pool.pids()}}), flush=True)
        time.sleep(600)
    """)
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        started = json.loads(driver.stdout.readline())
        ports = [int(u.rsplit(":", 1)[1]) for u in started["urls"]]
        servers = [p for g in started["guards"] for p in children(g)]
        assert len(ports) == 1 and len(servers) == 1 and all(listening(p) for p in ports)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        wait_for(lambda: not any(alive(p) for p in servers + started["guards"]), 15, "the guards to stop the servers")
        assert not any(listening(p) for p in ports)
    finally:
        if driver.poll() is None:
            driver.kill()


# ------------------------------------------------------------------------------- bad input
@pytest.mark.parametrize("override, line", [
    ("env.kwargs.package=requests", r"^env\.kwargs\.package=requests: not an OpenEnv env: the distribution has no "
                                    r"openenv\.yaml \(an env without one can be served from its app: "
                                    r"env\.kwargs\.app=module:attr\) \(env 'openenv'\)$"),
    ("env.kwargs.package=openenv-not-installed-x", r"^env\.kwargs\.package=openenv-not-installed-x: no installed "
                                                   r"distribution of that name"),
    ("env.kwargs.app=no_such_module.server.app:app", r"^env\.kwargs\.app=no_such_module\.server\.app:app: no module "
                                                     r"'no_such_module' is installed"),
    ("env.kwargs.app=server.app", r"^env\.kwargs\.app=server\.app: not module:attr"),
    ("env.kwargs.package=requests env.kwargs.sessions=0", r"^env\.kwargs\.sessions=0: must be an integer >= 1"),
    ("env.kwargs.app=a.b:c env.kwargs.timeout_s=0", r"^env\.kwargs\.timeout_s=0: must be a number > 0"),
    ("env.kwargs.url=ws://127.0.0.1:1", r"^env\.kwargs\.url=ws://127\.0\.0\.1:1: must be an http:// or https:// URL"),
    ("env.kwargs.url=http://127.0.0.1:1 env.kwargs.app=a.b:c", r"^env\.kwargs\.url/app: give exactly one of url"),
])
def test_bad_settings_are_one_line_before_anything_starts(override, line):
    with pytest.raises(ConfigError, match=line):
        load(["env=openenv", *override.split()], training=False)


def test_an_unreachable_url_and_a_missing_source_are_one_line():
    port = free_port()
    with pytest.raises(ConfigError, match=rf"^env\.kwargs\.url=http://127\.0\.0\.1:{port}: no OpenEnv server "
                                          r"answers GET /health there \(start it"):
        load(["env=openenv", f"env.kwargs.url=http://127.0.0.1:{port}"], training=False)
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.url: give exactly one of url \(a running server\), package "
                                          r"\(an installed OpenEnv env\) or app \(module:attr\), got none"):
        load(["env=openenv"], training=False)


def test_the_command_line_stops_with_exit_2_naming_the_value_before_a_run_folder(tmp_path, command_here):
    port = free_port()
    for override, said in ((f"env.kwargs.url=http://127.0.0.1:{port}", f"env.kwargs.url=http://127.0.0.1:{port}: "
                            "no OpenEnv server answers GET /health"),
                           ("env.kwargs.package=requests", "env.kwargs.package=requests: not an OpenEnv env")):
        proc = command_here(["train", "env=openenv", override, f"trainer.run_dir={tmp_path / 'run'}"])  # here
        assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
        lines = [x for x in proc.stderr.splitlines() if x.strip()]
        assert len(lines) == 1 and said in lines[0], lines
        assert not (tmp_path / "run").exists()


# ------------------------------------------------------------------------------- trained from the command line
SMALL = ["env.train_tasks=32", "env.val_tasks=4", "env.max_turns=3", "data.train_batch_size=2", "algorithm.n=2",
         "env.kwargs.sessions=4", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
         "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
         "model.corpus_tasks=8", "rollout.max_new_tokens=12", "trainer.num_workers=1", "trainer.loggers=[]",
         "trainer.progress=false", "trainer.save_at_end=false", "trainer.save_freq=0"]


def _train_args(tmp_path: Path, words_package: str, *extra: str) -> list[str]:
    """``openmanus-rl train`` on the Words package (its arguments after the command's name)."""
    return ["train", "env=openenv", "reward=openenv", f"env.kwargs.package={words_package}",
            f"env.kwargs.log_dir={tmp_path / 'servers'}", f"trainer.run_dir={tmp_path / 'run'}", *SMALL, *extra]


def _train(tmp_path: Path, words_package: str, *extra: str) -> subprocess.Popen:
    """``openmanus-rl train`` on the Words package in a process of its own, its output in ``tmp_path/out.txt``."""
    with open(tmp_path / "out.txt", "w") as out:
        return subprocess.Popen(
            [str(BIN / "openmanus-rl"), *_train_args(tmp_path, words_package, *extra)],
            stdout=out, stderr=subprocess.STDOUT, cwd=tmp_path,
            env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})


def _server_ports(tmp_path: Path) -> list[int]:
    return [int(p.stem.rsplit("_", 1)[1]) for p in (tmp_path / "servers").glob("openenv_*.log")]


@pytest.mark.slow
def test_trains_3_steps_from_the_command_line_on_the_served_package_and_leaves_no_server(words_package, tmp_path,
                                                                                         ray_local, command_here):
    """The command runs in this process (the console script's main, on the module's local Ray): the servers it
    started are stopped by the run itself, not by its process's exit."""
    proc = command_here(_train_args(tmp_path, words_package, "trainer.total_steps=3"))
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    records = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines() if x.strip()]
    train = [r for r in records if "train/reward_mean" in r]
    assert [r["step"] for r in train] == [1, 2, 3]
    for r in train:
        # 2 tasks x 2 samples, each ended by the server's done (its 3 attempts; the untrained model never says the
        # word), none by a failed call; the goal component is the sum of the server's (its rubric's) rewards
        assert (r["rollout/termination/done"], r["rollout/termination/env_error"]) == (4.0, 0.0)
        assert r["train/reward/goal/raw_mean"] == pytest.approx(r["rollout/env_reward/mean"])
    for step in (0, 3):
        episodes = [json.loads(x) for x in (tmp_path / "run" / "validation" / f"val_step_{step:06d}.jsonl")
                    .read_text().splitlines() if x.strip()]
        assert [ep["task_id"] for ep in episodes] == [32, 33, 34, 35]  # the task ids after the 32 training ones
        for ep in episodes:  # task id t is the env's reset(seed=t)
            assert ep["initial_observation"] == f"prompt: Say the word: {word_of(ep['task_id'])}\nattempts_left: 3"
    ports = _server_ports(tmp_path)
    assert ports and not any(listening(p) for p in ports)  # the run stopped its server


@pytest.mark.long
def test_no_server_is_left_after_the_trainer_is_killed_9(words_package, tmp_path):
    proc = _train(tmp_path, words_package, "trainer.total_steps=50")
    try:
        metrics = tmp_path / "run" / "metrics.jsonl"
        wait_for(lambda: metrics.exists() and metrics.read_text().strip() or proc.poll() is not None, 300,
                 "the first training step")
        ports = _server_ports(tmp_path)
        assert proc.poll() is None and ports and all(listening(p) for p in ports)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        wait_for(lambda: not any(listening(p) for p in ports), 20, "the guard to stop the servers")
    finally:
        if proc.poll() is None:
            proc.kill()
