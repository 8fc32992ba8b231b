"""Agents on record: each step's agents' outcomes in the run folder (run/agents.py), the tails of an agent's stdout
and stderr, the step line's env_error count, `inspect`'s listing of them, the line for an agent that posted a reward
without a call, an `agent.command` with `=` in it, and the options an agent run takes by default."""

from __future__ import annotations

import json
import shlex
import signal
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest

from openmanus_rl_core.config.loading import compose, literal_values
from openmanus_rl_core.gateway import agents
from openmanus_rl_core.gateway.agents import AgentJob, AgentOutcome, run_agents
from openmanus_rl_core.gateway.records import Call, EpisodeRecord
from openmanus_rl_core.gateway.rollout import agent_episode
from openmanus_rl_core.run.agents import no_call_line, read_records, record_agents, records_path
from openmanus_rl_core.run.progress import ProgressBar

BASE_URL = "http://127.0.0.1:9/v1"  # nothing listens there: the agents of the unit tests never call it
NO_CALL = "the agent posted a reward (0.5) but made no call to the gateway"


def _cfg(command=None, function=None):
    return SimpleNamespace(command=command, function=function, max_concurrent=4, timeout_s=30.0,
                           model_name="omrl-policy")


def _script(tmp_path: Path, body: str, name: str = "agent.py") -> str:
    script = tmp_path / name
    script.write_text("import json, os, sys\n" + textwrap.dedent(body))
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}"


# ------------------------------------------------------------------------------------------ the agent's outcome
def test_a_command_agents_outcome_keeps_its_exit_and_the_tails_of_its_stdout_and_stderr(tmp_path):
    command = _script(tmp_path, """
        task = json.loads(os.environ["OMRL_TASK"])
        for i in range(5000):  # more than the tail keeps: only the last whole lines stay
            print(f"line {i}")
        print("the end", file=sys.stderr)
        sys.exit(task["code"])
    """)
    outcomes = run_agents([AgentJob("ok", {"task_id": 0, "code": 0}), AgentJob("bad", {"task_id": 1, "code": 3})],
                          _cfg(command=command), BASE_URL, "m", lambda line: None)
    for outcome, code in zip(outcomes, (0, 3)):
        assert outcome.exit == code and outcome.stderr == "the end\n"
        assert outcome.stdout.endswith("line 4998\nline 4999\n") and outcome.stdout.startswith("line ")
        assert len(outcome.stdout) <= agents.STDERR_TAIL_CHARS
    assert outcomes[0].error is None and outcomes[1].error == "exited 3: the end"


def test_a_timed_out_command_keeps_its_output_so_far_and_the_signal_that_ended_it(tmp_path):
    command = _script(tmp_path, """
        import time
        print("waiting for the model", flush=True)
        time.sleep(1000)
    """)
    cfg = _cfg(command=command)
    cfg.timeout_s = 1.0
    [outcome] = run_agents([AgentJob("k", {"task_id": 0})], cfg, BASE_URL, "m", lambda line: None)
    assert outcome.error == "timed out after 1s (killed)" and outcome.stdout == "waiting for the model\n"
    assert outcome.exit == 128 + signal.SIGTERM  # as a shell reports a process ended by a signal


# ----------------------------------------------------------------------------------------- episodes on record
def _call(text: str = "<action>open box</action>") -> Call:
    return Call(prompt_ids=[1, 2, 3], completion_ids=[4, 5], logprobs=[-0.1, -0.2], version=0, text=text,
                finish_reason="stop", last_message="You see a box.")


def _episodes() -> list:
    """Three agent episodes: one that played (a call, reward 1), one that posted 0.5 without a call, one that
    crashed."""
    task = {"task_id": 7, "seed": 3, "group_id": "1:0", "sample_index": 0, "prompt": "a long row field"}
    played = agent_episode(EpisodeRecord("a", dict(task), calls=[_call()], reward=1.0),
                           AgentOutcome("a", None, None, 0.25, exit=0, stdout="played\n"), template=None)
    silent = agent_episode(EpisodeRecord("b", dict(task, task_id=8, sample_index=1), reward=0.5),
                           AgentOutcome("b", None, None, 0.5, exit=0), template=None)
    crashed = agent_episode(EpisodeRecord("c", dict(task, task_id=9)),
                            AgentOutcome("c", None, "exited 3: boom", 0.125, exit=3, stdout="hi\n", stderr="boom\n"),
                            template=None)
    return [played, silent, crashed]


def test_an_agent_that_posted_a_reward_but_made_no_call_is_env_error_with_an_error_that_says_so():
    played, silent, crashed = _episodes()
    assert played.trajectory.termination != "env_error" and played.trajectory.success is True
    assert (silent.trajectory.termination, silent.trajectory.error) == ("env_error", NO_CALL)
    assert (crashed.trajectory.termination, crashed.trajectory.error) == ("env_error", "exited 3: boom")
    assert silent.trajectory.info["agent"] == {"exit": 0, "error": None, "seconds": 0.5, "calls": 0, "reward": 0.5,
                                               "stderr": "", "stdout": ""}
    assert played.trajectory.info["agent"]["calls"] == 1 and played.trajectory.info["agent"]["stdout"] == "played\n"


def test_each_step_writes_its_agents_outcomes_and_one_line_for_those_that_posted_without_a_call(tmp_path):
    logged: list[str] = []
    episodes = _episodes()
    record_agents(tmp_path, 3, episodes, logged.append)
    record_agents(tmp_path, 3, episodes[:1], logged.append, prefix="val")  # the step's validation: its own file
    record_agents(tmp_path, 0, episodes[1:2], logged.append, prefix="warmup/val")
    assert logged == [
        "step 3: 1 of 3 agents posted a reward but made no call to the gateway (tasks 8): their episodes are "
        "env_error and leave the loss; an agent must ask the policy at $OPENAI_BASE_URL with its $OPENAI_API_KEY",
        "warmup/val at step 0: 1 of 1 agents posted a reward but made no call to the gateway (tasks 8): their "
        "episodes are env_error and leave the loss; an agent must ask the policy at $OPENAI_BASE_URL with its "
        "$OPENAI_API_KEY"]
    path = records_path(tmp_path, 3)
    assert path == tmp_path / "agents" / "step_000003.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert rows == [
        {"task_id": 7, "seed": 3, "group_id": "1:0", "sample_index": 0, "validation": False, "exit": 0, "error": None,
         "seconds": 0.25, "calls": 1, "reward": 1.0, "stderr": "", "stdout": "played\n", "termination": "done"},
        {"task_id": 8, "seed": 3, "group_id": "1:0", "sample_index": 1, "validation": False, "exit": 0,
         "error": NO_CALL, "seconds": 0.5, "calls": 0, "reward": 0.5, "stderr": "", "stdout": "",
         "termination": "env_error"},
        {"task_id": 9, "seed": 3, "group_id": "1:0", "sample_index": 0, "validation": False, "exit": 3,
         "error": "exited 3: boom", "seconds": 0.125, "calls": 0, "reward": None, "stderr": "boom\n",
         "stdout": "hi\n", "termination": "env_error"}]
    assert sorted(p.name for p in (tmp_path / "agents").iterdir()) == [
        "step_000003.jsonl", "val_step_000003.jsonl", "warmup_val_step_000000.jsonl"]
    on_record = read_records(tmp_path)
    assert list(on_record) == [("warmup_val", 0), ("", 3), ("val", 3)]
    assert on_record[("", 3)] == rows and on_record[("val", 3)][0]["validation"] is True


def test_a_run_without_an_agent_writes_no_agents_file_and_no_line(tmp_path):
    from openmanus_rl_core.protocols import Trajectory
    from openmanus_rl_core.rollout.episode import Episode

    episode = Episode(trajectory=Trajectory(task_id=1, seed=0, group_id="1:0", initial_observation=""),
                      prompt_ids=[1])
    logged: list[str] = []
    assert record_agents(tmp_path, 1, [episode], logged.append) == [] and logged == []
    assert not (tmp_path / "agents").exists()
    assert no_call_line([episode], "step 1") is None


# ----------------------------------------------------------------------------------------- the step line
def test_the_step_line_counts_env_error_episodes_of_the_step_and_of_its_validation():
    import io

    with ProgressBar(total=4, disable=True, lines=io.StringIO()) as bar:
        metrics = {"train/reward_mean": 0.5, "train/success_rate": 0.25, "rollout/episodes": 16.0,
                   "rollout/termination/env_error": 3.0, "timing/step": 2.0}
        assert bar.step_line(1, metrics) == "step 1/4: reward 0.500, success 0.250, env_error 3/16, 2.00s"
        val = {"val/reward_mean": 0.5, "val/success_rate": 0.5, "val/termination/done": 3.0,
               "val/termination/env_error": 1.0}
        assert bar.step_line(2, {**metrics, "rollout/termination/env_error": 0.0, **val}) == (
            "step 2/4: reward 0.500, success 0.250, val reward 0.500 success 0.500 env_error 1/4, 2.00s")


# ----------------------------------------------------------------------------------------------- inspect
def test_inspect_lists_an_agent_runs_env_errors_by_step_without_dumps(tmp_path, command_here):
    record_agents(tmp_path, 1, _episodes(), lambda line: None)
    record_agents(tmp_path, 1, _episodes()[2:], lambda line: None, prefix="val")
    out = command_here(["inspect", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [
        f"agents: 4 episodes on record in {tmp_path / 'agents'}, 3 env_error",
        "  step 1: 2 of 3 env_error",
        f"    1x {NO_CALL} (tasks 8)",
        "    1x exited 3: boom (tasks 9)",
        "  step 1 (val): 1 of 1 env_error",
        "    1x exited 3: boom (tasks 9)"]


def test_inspect_of_a_folder_without_dumps_or_agents_is_one_line(tmp_path, command_here):
    out = command_here(["inspect", str(tmp_path)])
    assert out.returncode == 2
    assert out.stderr.splitlines() == [
        f"error: {tmp_path}: no rollout dumps in {tmp_path / 'rollouts'} (a run writes them with "
        f"trainer.save_rollouts=true) and no agent records in {tmp_path / 'agents'}"]


# ------------------------------------------------------------------------------------ agent.command with `=`
@pytest.mark.parametrize("command", [
    "python agent.py --mode=fast",
    "python agent.py --tags a,b --x=1",  # a comma is no sweep
    "python -c 'import sys; print(sys.argv)' k=v",
    'python agent.py --name "two words" --v=\\"q\\"',
    "echo a\\ b \\",  # backslashes, one at the end
    "python agent.py --home=${oc.env:HOME}",  # an interpolation still resolves
])
def test_agent_command_is_taken_as_written(command):
    import os

    cfg = compose([f"agent.command={command}", "template=react", "reward=default"])
    assert cfg.agent.command == command.replace("${oc.env:HOME}", os.environ["HOME"])


def test_an_agent_command_in_hydras_own_quotes_or_null_is_left_to_hydra():
    assert literal_values(["agent.command='a=b c'", "agent.command=null", "env=key_door"]) == [
        "agent.command='a=b c'", "agent.command=null", "env=key_door"]
    assert compose(["agent.command='python a.py --k=v'", "template=react", "reward=default"]).agent.command == (
        "python a.py --k=v")


def test_an_agent_command_with_equals_reaches_the_agent_check_from_the_command_line(tmp_path, command_here):
    run = tmp_path / "run"
    out = command_here(["train", f"trainer.run_dir={run}", "agent.command=nosuch-agent --mode=fast --tags=a,b"])
    assert out.returncode == 2
    assert out.stderr.splitlines() == ["error: agent.command='nosuch-agent --mode=fast --tags=a,b': the program "
                                       "'nosuch-agent' is not found on PATH; install it or give its path"]
    assert not run.exists()


# ------------------------------------------------------------------------------------ an agent run's options
AGENT_LINE = ("agent run: reward=agent (the reward the agent posts), template=message (every reply a valid action, "
              "no format penalty); give reward=... or template=... to choose otherwise (e.g. the template your "
              "agent's replies are written in: the warm-up writes its demonstrations in it)")
AGENT_REWARD = {"goal": {"name": "goal", "weight": 1.0, "kwargs": {"use_score": True}}}


def _options(overrides: list[str]) -> tuple[dict, str, list[str]]:
    from omegaconf import OmegaConf

    lines: list[str] = []
    cfg = compose(overrides, log=lines.append)
    return OmegaConf.to_container(cfg.reward.components), cfg.template.name, lines


def test_an_agent_run_scores_the_posted_reward_and_reads_every_reply_as_valid_unless_told_otherwise():
    default_reward, default_template, lines = _options([])
    assert lines == [] and default_template == "react" and set(default_reward) == {"goal", "format", "invalid_action"}
    for agent in ("agent.command=python agent.py", "agent.function=pkg.mod:fn"):
        assert _options([agent]) == (AGENT_REWARD, "message", [AGENT_LINE])
    reward, template, lines = _options(["agent.command=x", "reward=goal"])
    assert (reward["goal"]["kwargs"], template) == ({"use_score": False}, "message")
    assert lines == ["agent run: template=message (every reply a valid action, no format penalty); give template=... "
                     "to choose otherwise (e.g. the template your agent's replies are written in: the warm-up writes "
                     "its demonstrations in it)"]
    reward, template, lines = _options(["agent.command=x", "template=react"])
    assert (reward, template, len(lines)) == (AGENT_REWARD, "react", 1)
    # a key under the group is the user's choice of the group's composed option
    reward, template, lines = _options(["agent.command=x", "reward.components.goal.weight=2", "template=react"])
    assert set(reward) == {"goal", "format", "invalid_action"} and reward["goal"]["weight"] == 2 and lines == []


def test_an_option_file_that_chooses_the_reward_keeps_it_in_an_agent_run(tmp_path):
    """An experiment (``+experiment=...``) that overrides the reward option chose it: the agent run keeps it."""
    from omegaconf import OmegaConf

    from openmanus_rl_core.hookspecs import hookimpl
    from openmanus_rl_core.plugin.manager import make_plugin_manager

    (tmp_path / "experiment").mkdir()
    (tmp_path / "experiment" / "goal_only.yaml").write_text(
        "# @package _global_\ndefaults:\n  - override /reward: goal\n")

    class Configs:
        @hookimpl
        def openmanus_rl_config_dirs(self) -> list[str]:
            return [str(tmp_path)]

    pm = make_plugin_manager()
    pm.register(Configs())
    lines: list[str] = []
    cfg = compose(["agent.command=x", "+experiment=goal_only"], pm=pm, log=lines.append)
    assert OmegaConf.to_container(cfg.reward.components) == {
        "goal": {"name": "goal", "weight": 1.0, "kwargs": {"use_score": False}}}
    assert cfg.template.name == "message" and len(lines) == 1 and "reward=agent" not in lines[0]


def test_the_message_template_reads_any_non_empty_reply_as_a_valid_action():
    from openmanus_rl_core.plugin.registry import registry
    from openmanus_rl_core.testing import check_template

    template = registry("template").build("message")
    check_template(template)
    reply = '{"name": "search", "arguments": {"q": "door"}}\n'
    parsed = template.parse(reply)
    assert (parsed.kind, parsed.content, parsed.valid) == ("message", reply.strip(), True)
    assert template.parse("  \n").valid is False and template.stop == [] and template.end_pattern is None
    assert template.system_prompt("Open the door.") == "Open the door."


# --------------------------------------------------------------------------------------------- a whole run
AGENT = """
from openai import OpenAI

task = json.loads(os.environ["OMRL_TASK"])
if sys.argv[1:] != ["--mode=fast"]:  # the `=` arrived as written
    sys.exit(f"argv {sys.argv[1:]}")
client = OpenAI()
group, sample = str(task["group_id"]), task["sample_index"]
if group.endswith(":0") and not group.startswith("val") and sample == 0:  # posts without asking the policy
    client.post("/rl/reward", body={"reward": 0.5}, cast_to=object)
elif group.endswith(":0") and not group.startswith("val"):
    print("hello from stdout")
    sys.exit("boom")
else:
    client.chat.completions.create(model=os.environ["OMRL_MODEL"], max_tokens=4,
                                   messages=[{"role": "user", "content": "open the door"}])
    reward = 0.25 if group.startswith("val") else float(sample == 0)
    client.post("/rl/reward", body={"reward": reward}, cast_to=object)
    print(f"played {group}")
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_run_keeps_its_agents_outcomes_counts_env_errors_and_scores_the_posted_reward(tmp_path, ray_local,
                                                                                         command_here):
    from test_resume_config import SMALL

    run = tmp_path / "run"
    command = _script(tmp_path, AGENT) + " --mode=fast"
    out = command_here(["train", *SMALL, f"trainer.run_dir={run}", "trainer.total_steps=1",
                        f"agent.command={command}", "trainer.max_env_error_steps=0"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert AGENT_LINE in out.stdout.splitlines()
    settings = json.loads((run / "config.json").read_text())
    assert settings["template"]["name"] == "message" and settings["reward"]["components"] == AGENT_REWARD
    rows = [json.loads(line) for line in records_path(run, 1).read_text().splitlines()]
    assert len(rows) == 4 and {r["group_id"] for r in rows} == {"1:0", "1:1"}
    by = {(r["group_id"], r["sample_index"]): r for r in rows}
    silent, crashed = by[("1:0", 0)], by[("1:0", 1)]
    assert (silent["calls"], silent["reward"], silent["exit"], silent["termination"]) == (0, 0.5, 0, "env_error")
    assert silent["error"] == NO_CALL
    assert (crashed["exit"], crashed["error"], crashed["termination"]) == (1, "exited 1: boom", "env_error")
    assert (crashed["stdout"], crashed["stderr"]) == ("hello from stdout\n", "boom\n")
    for sample in (0, 1):
        r = by[("1:1", sample)]
        assert (r["calls"], r["reward"], r["exit"], r["error"]) == (1, float(sample == 0), 0, None)
        assert r["stdout"] == "played 1:1\n" and r["termination"] != "env_error"
    step_lines = [ln for ln in out.stdout.splitlines() if ln.startswith("step 1/1:")]
    assert len(step_lines) == 1 and ", env_error 2/4" in step_lines[0], out.stdout[-3000:]
    assert [ln for ln in out.stdout.splitlines() if "made no call" in ln] == [
        f"step 1: 1 of 4 agents posted a reward but made no call to the gateway (tasks {silent['task_id']}): their "
        f"episodes are env_error and leave the loss; an agent must ask the policy at $OPENAI_BASE_URL with its "
        f"$OPENAI_API_KEY"]
    val = [json.loads(line) for line in records_path(run, 1, "val").read_text().splitlines()]
    assert len(val) == 2 and all(r["validation"] and r["calls"] == 1 and r["reward"] == 0.25 for r in val)
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert metrics[-1]["val/reward_mean"] == 0.25  # the posted reward as it was posted: no format terms
    shown = command_here(["inspect", str(run)])
    assert shown.returncode == 0 and "  step 1: 2 of 4 env_error" in shown.stdout.splitlines()
    assert f"    1x exited 1: boom (tasks {crashed['task_id']})" in shown.stdout.splitlines()
