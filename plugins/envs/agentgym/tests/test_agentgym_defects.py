"""One test (at least) per defect found running the AgentGym servers for real (issue 12), each against the fake
server (a real FastAPI app; fault injection only), plus the client's limits. The numbers refer to the issue's list.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from openmanus_rl_core.algorithms.estimators import grpo_estimator
from openmanus_rl_core.cli import main as cli_main
from openmanus_rl_core.config.loading import compose
from openmanus_rl_core.data.openmanus_layout import OPENMANUS_SCHEMA
from openmanus_rl_core.data.tasks import load_tasks
from openmanus_rl_core.plugin.envs import EnvUnavailableError
from openmanus_rl_core.run.metrics import LearningSignalWatch
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.protocols import Generation
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig, build_batch, tokenizer_corpus
from openmanus_rl_core.run.warmup import build_demonstrations
from openmanus_rl_env_agentgym import AgentGymEnv, EnvServerError
from openmanus_rl_env_agentgym.factories import make_env, serve_env

from test_agentgym_client import FAKE, fake_command, fake_launcher, free_base_port

REPO = Path(__file__).resolve().parents[4]


class PerPromptEngine:
    """Answers the i-th prompt of every generate call with ``replies[i]`` (rendered by the template)."""

    def __init__(self, tokenizer, template, replies):
        self.tok, self.template, self.replies = tokenizer, template, replies

    def generate(self, prompts, params):
        self.prompts = list(prompts)
        out = []
        for i in range(len(prompts)):
            text = self.template.render(self.replies[i % len(self.replies)])
            ids = self.tok.encode(text, add_special_tokens=False) + [self.tok.eos_token_id]
            out.append(Generation(list(ids), [-0.1] * len(ids), text, "stop"))
        return out

    def update_weights(self, state_dict):
        pass


@pytest.fixture(scope="module")
def tok_and_template():
    template = registry("template").build("react")
    words = ["inc", "look", "__error__", "Goal: count up to", "Crafting commands:", "craft 1 item_ using 2 part_"]
    return build_tokenizer([template.render(w) for w in words] + words, vocab_size=400), template


def _stats(url: str) -> dict:
    import requests

    return requests.get(url + "/_stats", timeout=5).json()


# ------------------------------------------------------------------ 1. an unreachable server looks like success
def test_1_train_against_an_unreachable_server_fails_before_building_a_model(tmp_path, capsys):
    port = free_base_port()
    rc = cli_main(["train", "env=agentgym_textcraft", f"env.kwargs.base_port={port}", f"trainer.run_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert rc == 1
    assert f"http://127.0.0.1:{port}" in err and "no server answers" in err and "autostart" in err
    assert not (tmp_path / "model").exists()  # the health check ran before the model and tokenizer


def test_1_rollout_exits_non_zero_when_every_episode_failed(tmp_path, capsys):
    with fake_launcher("id", "--broken-reset-after", "2") as servers:  # the corpus's 2 resets work, then none
        rc = cli_main(["rollout", "env=agentgym_textcraft", "template=react", f"env.kwargs.base_port={servers.base_port}",
                       "rollout.num_tasks=2", "rollout.n=2", f"rollout.output_dir={tmp_path}",
                       "model.tiny.vocab_size=300", "rollout.max_new_tokens=4"])
    assert rc == 1
    assert "every episode ended as env_error" in capsys.readouterr().err


def test_1_the_env_error_watch_aborts_after_n_all_failed_steps():
    from openmanus_rl_core.plugin.envs import EnvErrorWatch

    watch = EnvErrorWatch(2)
    watch.update(1, ["env_error", "env_error"], ["refused", None])
    watch.update(2, ["done", "env_error"], [None, "refused"])  # one episode worked: the streak starts over
    watch.update(3, ["env_error"], ["refused at http://x"])
    with pytest.raises(EnvUnavailableError, match=r"last 2 steps \(up to step 4\).*refused at http://y"):
        watch.update(4, ["env_error"], ["refused at http://y"])
    EnvErrorWatch(0).update(1, ["env_error"], ["x"])  # 0: never aborts
    # With a check: a server back after a restart gives the run another 2 steps, once per streak.
    checks = []
    watch = EnvErrorWatch(2, check=lambda: checks.append(1))
    for step in (1, 2, 3):
        watch.update(step, ["env_error"], ["refused"])
    assert checks == [1]
    with pytest.raises(EnvUnavailableError, match="up to step 4"):
        watch.update(4, ["env_error"], ["refused"])

    # A working step after the recheck re-arms it: the next streak is rechecked too, not aborted at once.
    checks = []
    watch = EnvErrorWatch(2, check=lambda: checks.append(1))
    watch.update(1, ["env_error"], ["refused"])
    watch.update(2, ["env_error"], ["refused"])  # streak of 2: rechecked, the server answers
    assert checks == [1] and watch.streak == 0 and watch.rechecked
    watch.update(3, ["done"], [None])  # it works again
    assert not watch.rechecked
    watch.update(4, ["env_error"], ["refused"])
    watch.update(5, ["env_error"], ["refused"])  # a new streak of 2: rechecked again
    assert checks == [1, 1] and watch.streak == 0
    with pytest.raises(EnvUnavailableError, match=r"last 2 steps \(up to step 7\)"):
        watch.update(6, ["env_error"], ["refused"])
        watch.update(7, ["env_error"], ["refused"])  # no working step since the last recheck: abort

    def gone():
        raise EnvUnavailableError("no server answers at http://z")

    watch = EnvErrorWatch(2, check=gone)
    watch.update(1, ["env_error"], ["refused"])
    with pytest.raises(EnvUnavailableError, match="http://z"):
        watch.update(2, ["env_error"], ["refused"])


# --------------------------------------------------------------- 2. env_error episodes move group advantages
def test_2_env_error_episodes_leave_their_groups_advantages(tok_and_template):
    tok, template = tok_and_template
    with fake_launcher("id", "--chaos") as servers:
        url = servers.urls[0]
        # Task 0 is won by one `inc` (reward 1), `look` earns 0, `__error__` ends its episode as env_error.
        tasks = [{"task_id": 0, "seed": 0, "group_id": g} for g in ("a", "a", "a", "b", "b")]
        engine = PerPromptEngine(tok, template, ["inc", "look", "__error__", "inc", "__error__"])
        loop = AgentLoop(engine, tok, template, lambda: AgentGymEnv("textcraft", base_url=url, timeout=5),
                         RolloutConfig(max_turns=1, max_new_tokens=8))
        episodes = loop.run(tasks)
    assert [e.trajectory.termination for e in episodes] == ["done", "max_turns", "env_error", "done", "env_error"]
    batch = build_batch(episodes, None, registry("allocator").build("last_token"), tok.pad_token_id)
    batch["token_level_rewards"] = batch["token_level_scores"]
    adv, _ = grpo_estimator(batch, epsilon=0.0)
    per_row = [float(adv[i][batch["response_mask"][i].bool()].mean()) if batch["response_mask"][i].any() else 0.0
               for i in range(5)]
    # group a: valid scores [1, 0] -> +-1/sqrt(2) (with the error's 0 counted it would be 1.155 / -0.577);
    # group b: one valid member -> 0 (with the error counted: +0.707)
    assert per_row == pytest.approx([2 ** -0.5, -(2 ** -0.5), 0.0, 0.0, 0.0])


# ------------------------------------------- 3. one launcher owner; no orphans (the training run is further down)
def test_3_serve_starts_the_servers_once_and_workers_get_urls_only(tmp_path):
    base = free_base_port(2)
    launcher = {"command": fake_command("id"), "health_timeout": 30, "log_dir": str(tmp_path)}
    service = serve_env("textcraft", base_port=base, num_servers=2, autostart=True, launcher=launcher, timeout=5)
    try:
        assert "autostart" not in service.kwargs and service.kwargs["base_port"] == base
        env = make_env("textcraft", **service.kwargs)  # what a worker builds: no launcher of its own
        assert env.reset(0).startswith("Task 0")
        env.close()
        from openmanus_rl_env_agentgym import launcher as launcher_module

        assert not launcher_module._SHARED  # no per-process shared launcher was made
    finally:
        service.close()
    assert _listening_pids(base) == [] and _listening_pids(base + 1) == []


def _listening_pids(port: int) -> list[int]:
    """Pids of live processes whose command line runs the fake server on ``port``."""
    found = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
            state = (d / "stat").read_text().split()[2]
        except OSError:
            continue
        if state != "Z" and FAKE.encode() in argv and str(port).encode() in argv:
            found.append(int(d.name))
    return found


# ----------------------------------------------------------------------------- 4. the TextCraft goal is cut off
def test_4_a_long_first_observation_keeps_its_goal_line(tok_and_template):
    tok, template = tok_and_template
    with fake_launcher("id") as servers:
        engine = PerPromptEngine(tok, template, ["look"])
        loop = AgentLoop(engine, tok, template, lambda: AgentGymEnv("textcraft", base_url=servers.urls[0], timeout=5),
                         RolloutConfig(max_turns=1, max_new_tokens=8, max_obs_tokens=64))
        (episode,) = loop.run([{"task_id": 1001, "seed": 0}])
    assert episode.trajectory.info["obs_truncated"] == 1
    shown = tok.decode(episode.prompt_ids)
    assert "Goal: count up to 3." in shown and "Crafting commands:" in shown and "[...]" in shown


def test_4_agentgym_textcraft_limits_fit_its_measured_episodes():
    # docs/agentgym.md (a real server, Qwen3 tokenizer): first observations p90 341 tokens (TextCraft), 261
    # (BabyAI); later observations at most 18 (TextCraft), p90 209 (BabyAI); 20 turns
    for env, later in (("agentgym_textcraft", 28), ("agentgym_babyai", 105)):
        r = compose([f"env={env}"]).rollout
        assert r.max_turns == 20 and r.max_obs_tokens >= 341 and r.max_prompt_tokens >= r.max_obs_tokens + 200
        assert r.max_response_tokens >= r.max_turns * (r.max_new_tokens + later)


# ------------------------------------------------------ 5. the launcher and the corpus (one start, not one per task)
def test_5_a_server_that_cannot_start_is_started_once_not_once_per_corpus_task(tmp_path):
    starts = tmp_path / "starts"
    command = f"echo start >> {starts}; exit 3"
    factory = lambda: make_env("textcraft", base_port=free_base_port(), autostart=True,  # noqa: E731
                               launcher={"command": command, "health_timeout": 60})
    template = registry("template").build("react")
    with pytest.raises(Exception, match="exited with code 3"):  # the first start fails the corpus at once
        tokenizer_corpus(factory, template, [{"task_id": i, "seed": 0} for i in range(5)])
    assert starts.read_text().splitlines() == ["start"]


def test_5_the_launcher_runs_a_server_from_its_working_directory(tmp_path):
    (tmp_path / "recipes").mkdir()
    (tmp_path / "recipes" / "oak.json").write_text("{}")
    base = free_base_port()
    launcher = {"command": fake_command("id", "--need-file", "recipes/oak.json"), "health_timeout": 30,
                "cwd": str(tmp_path)}
    service = serve_env("textcraft", base_port=base, autostart=True, launcher=launcher)
    try:
        assert AgentGymEnv("textcraft", base_url=f"http://127.0.0.1:{base}").healthy()
    finally:
        service.close()
    with pytest.raises(EnvUnavailableError, match="not found"):  # without the cwd it exits, quoting its log
        serve_env("textcraft", base_port=base, autostart=True, launcher={**launcher, "cwd": None})


# ------------------------------------------------------------------------- 6. server-side envs are never closed
def test_6_envs_are_closed_where_the_openapi_schema_lists_close():
    with fake_launcher("id") as servers, fake_launcher("id", "--no-close") as plain:
        for url in (servers.urls[0], plain.urls[0]):
            for task in range(3):
                env = AgentGymEnv("textcraft", base_url=url, timeout=5)
                env.reset(task)
                env.step("inc")
                env.close()
        assert _stats(servers.urls[0]) == {"created": 3, "closed": 3, "live": 0}
        assert _stats(plain.urls[0]) == {"created": 3, "closed": 0, "live": 3}  # no /close: none is asked for


# --------------------------------------------------------------------------- 7. BabyAI success is never reported
def test_7_a_babyai_mission_finished_with_reward_0_8875_is_a_success():
    with fake_launcher("id", "--final-reward", "0.8875") as servers:
        env = AgentGymEnv("babyai", base_url=servers.urls[0], timeout=5)
        env.reset(0)
        result = env.step("inc")
        env.close()
    assert result.done and result.reward == pytest.approx(0.8875)
    assert result.info["success"] is True


# ------------------------------------------------------------------------------ 8. task ranges the server accepts
def test_8_indices_beyond_the_old_ranges_are_accepted():
    with fake_launcher("id") as servers:
        for name, index in (("textcraft", 518), ("babyai", 810), ("babyai", 999)):
            env = AgentGymEnv(name, base_url=servers.urls[0], timeout=5)
            assert env.reset(index).startswith(f"Task {index}:")
            env.close()
    with pytest.raises(ValueError, match=r"outside \[0, inf\)"):
        AgentGymEnv("textcraft", port=1)._data_index(-1, None)


# ------------------------------------------------------------------------------ 9. warm-up without an oracle
def test_9_no_oracle_and_no_demonstrations_gives_no_warmup_instead_of_a_crash(tok_and_template):
    tok, template = tok_and_template
    with fake_launcher("id") as servers:
        factory = lambda: AgentGymEnv("textcraft", base_url=servers.urls[0], timeout=5)  # noqa: E731
        assert build_demonstrations(factory, template, tok, [{"task_id": 0, "seed": 0}], 4) == []
        demo = {"observation": "Task 0: count up to 1.", "steps": [["inc", "You reached 1. Task complete."]]}
        (ids, mask), = build_demonstrations(factory, template, tok, [{"task_id": 0, "seed": 0,
                                                                      "demonstration": demo}], 4)
    assert tok.decode([t for t, m in zip(ids, mask) if m]).startswith(template.render("inc"))
    metrics = {"train/zero_adv_frac": 1.0, "train/reward_mean": 0.0, "train/reward_std": 0.0}
    quiet = LearningSignalWatch(1, warmup_hint=False).update(1, metrics)
    assert "warmup" not in quiet and "no learning signal" in quiet


# ------------------------------------------------------------------ 10. OpenManus-RL's data files, read directly
def openmanus_table(rows: list[tuple[str, list[str], list[str]]]) -> pa.Table:
    """A table in OpenManus-RL's layout: per row (item_id, actions, observations after each action)."""
    records = []
    for i, (item, actions, observations) in enumerate(rows):
        first = f"Task {item.rpartition('_')[2]}: count up to 1. Actions: inc, look. You are at 0."
        conv = [{"from": "human", "loss": None, "value": "You play a counting game. Reply Thought: ... Action: ..."},
                {"from": "gpt", "loss": False, "value": "OK"},
                {"from": "human", "loss": None, "value": first}]
        for a, o in zip(actions, observations):
            conv.append({"from": "gpt", "loss": True, "value": f"Thought: go on.\n\nAction: {a}"})
            conv.append({"from": "human", "loss": None, "value": o})
        records.append({
            "data_source": "agentgym", "item_id": item, "conversations": conv,
            "prompt": [{"content": first, "role": "user"}], "ability": "agent",
            "reward_model": {"ground_truth": f"answer {i}", "style": "rule"},
            "extra_info": {"conversations": json.dumps(conv), "index": i, "split": "train"},
        })
    return pa.Table.from_pylist(records, schema=OPENMANUS_SCHEMA)


def test_10_openmanus_rl_files_are_read_and_data_verify_replays_them(tmp_path, capsys):
    path = tmp_path / "om.parquet"
    pq.write_table(openmanus_table([("textcraft_3", ["look", "inc"], ["You are at 0; the goal is 1.", "Done."]),
                                    ("textcraft_518", ["look"], ["You are at 0; the goal is 1."])]), path)
    tasks = load_tasks(path)
    assert [t["task_id"] for t in tasks] == [3, 518]
    assert tasks[0]["demonstration"]["steps"] == [["look", "You are at 0; the goal is 1."], ["inc", "Done."]]
    assert tasks[0]["observation"].startswith("Task 3: count up to 1.")
    assert tasks[1]["ground_truth"] == "answer 1" and tasks[1]["extra"] == {"index": 1, "split": "train"}
    with fake_launcher("id") as servers:
        rc = cli_main(["data", "verify", "env=agentgym_textcraft", f"env.kwargs.base_port={servers.base_port}",
                       f"data.val_files={path}"])
    out = capsys.readouterr().out
    assert rc == 1  # row 1's demonstration never reaches the goal
    assert "1/2 demonstrations succeed (success rate 0.500)" in out and "row 1 (textcraft_518)" in out
    assert "row 0" not in out


# -------------------------------------------------------------------------------------------- client limits
def test_a_body_trickled_in_slowly_is_cut_off_at_the_total_deadline():
    with fake_launcher("id", "--chaos") as servers:
        env = AgentGymEnv("textcraft", base_url=servers.urls[0], timeout=1.5, retries=0)
        env.reset(0)
        t0 = time.monotonic()
        with pytest.raises(EnvServerError, match="no complete answer within 1.5s"):
            env.step("__trickle__")  # ~60 bytes at 5 bytes/s: 12 s without a total deadline
        assert time.monotonic() - t0 < 3.5
        env.close()


def test_deep_large_and_non_boolean_answers_raise_env_server_errors():
    with fake_launcher("id", "--chaos") as servers:
        env = AgentGymEnv("textcraft", base_url=servers.urls[0], timeout=5, retries=0)
        env.reset(0)
        with pytest.raises(EnvServerError, match="nested deeper than max_json_depth=64"):
            env.step("__deep__")
        env.reset(0)
        assert env.step("__strdone__").done is False  # the string "false" is not done
        small = AgentGymEnv("textcraft", base_url=servers.urls[0], timeout=5, retries=0, max_response_bytes=20)
        with pytest.raises(EnvServerError, match="over max_response_bytes=20"):
            small.reset(1)
        env.close()
        small.close()
    bad = AgentGymEnv("textcraft", port=1)
    with pytest.raises(EnvServerError, match="'done' = maybe is not a boolean"):
        bad._flag({"done": "maybe"}, "done")


# ------------------------------------------- 3. (the run) a server killed mid-train: one restart, no orphan left
SMALL_RUN = [
    "template=react", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
    "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
    "data.train_batch_size=4", "algorithm.n=2", "env.train_tasks=16", "env.val_tasks=4", "env.max_turns=3",
    "rollout.max_new_tokens=8", "warmup.steps=2", "trainer.progress=false", "trainer.loggers=[]",
    "trainer.num_cpus=2", "trainer.val_before_train=false", "trainer.val_at_end=false", "trainer.save_freq=0",
    "trainer.save_at_end=false", "env.kwargs.timeout=5", "env.kwargs.retries=0",
]


def _metrics_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.ray
@pytest.mark.slow
def test_3_a_server_killed_mid_train_is_restarted_once_by_the_driver_and_none_is_left(tmp_path):
    cli_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    base = free_base_port()
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    command = f"{sys.executable} {FAKE} --port {{port}} --shape id"
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "openmanus-rl"), "train", "env=agentgym_textcraft", *SMALL_RUN,
         "trainer.total_steps=4", f"trainer.run_dir={run_dir}", f"env.kwargs.base_port={base}",
         "env.kwargs.autostart=true", f"env.kwargs.launcher.command='{command}'",
         f"++env.kwargs.launcher.log_dir={logs}"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=cli_env)
    try:
        deadline = time.monotonic() + 300
        while not _metrics_steps(run_dir) and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        servers = [p for p in _listening_pids(base) if _argv(p)[1:2] == [FAKE]]
        assert len(servers) == 1, (servers, proc.poll(), proc.poll() is not None and proc.stdout.read()[-3000:])
        os.kill(servers[0], signal.SIGKILL)
        out, _ = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert _metrics_steps(run_dir)[-1] == 4
    assert "warm-up skipped: env 'agentgym_textcraft' has no oracle" in out
    starts = (logs / f"textcraft_{base}.log").read_text().count("=== ")
    assert starts == 2, f"expected the first start and one restart, got {starts} starts"
    time.sleep(1.0)  # the guard's poll
    assert _listening_pids(base) == []  # no orphaned server or guard


def _argv(pid: int) -> list[str]:
    try:
        return [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0") if a]
    except OSError:
        return []
