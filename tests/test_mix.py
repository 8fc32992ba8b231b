"""env=mix: several envs in one run (openmanus_rl_core/plugin/mix.py, data/sources.py): each step draws every source
by ratio from its own order, a resumed run continues each source where it was, each source's episodes play its
own env with its own instruction and turn limit, and its metrics are its own."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from types import SimpleNamespace
from pathlib import Path

import pytest

from openmanus_rl_core.data.sources import SourceSampler
from openmanus_rl_core.data.tasks import DataError
from kills import kill_once_written

BIN = Path(sys.executable).parent
SOURCES = ["+env.kwargs.sources.key_door.train_tasks=12", "+env.kwargs.sources.key_door.val_tasks=4",
           "+env.kwargs.sources.legs.train_tasks=12", "+env.kwargs.sources.legs.val_tasks=4"]
SMALL = ["env=mix", *SOURCES, "trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1",
         "trainer.num_workers=1", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
         "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
         "data.train_batch_size=4", "algorithm.n=2", "warmup.steps=1", "rollout.max_new_tokens=8", "seed=5"]


def _rows(source: str, n: int) -> list[dict]:
    return [{"task_id": i, "seed": i, "source": source} for i in range(n)]


# ------------------------------------------------------------------------------------------------ draws
def test_each_batch_takes_every_source_at_its_ratio_from_its_own_order():
    tasks = _rows("a", 10) + _rows("b", 3)
    sampler = SourceSampler(tasks, 4, {"a": 3, "b": 1}, seed=0)
    batches = [sampler.next_batch() for _ in range(6)]
    assert [Counter(t["source"] for t in b) for b in batches] == [Counter(a=3, b=1)] * 6
    # each source walks its own epochs: 18 rows of a over 10 tasks are epoch 0 whole, then 8 of epoch 1
    a_ids = [t["task_id"] for b in batches for t in b if t["source"] == "a"]
    assert sorted(a_ids[:10]) == list(range(10)) and len(set(a_ids[10:])) == 8
    b_ids = [t["task_id"] for b in batches for t in b if t["source"] == "b"]
    assert sorted(b_ids[:3]) == [0, 1, 2] and sorted(b_ids[3:6]) == [0, 1, 2]


def test_a_batch_smaller_than_the_ratio_alternates_and_never_drifts_by_a_row():
    sampler = SourceSampler(_rows("a", 5) + _rows("b", 5), 2, {"a": 3, "b": 1})
    drawn = Counter()
    for step in range(1, 21):
        drawn.update(t["source"] for t in sampler.next_batch())
        assert abs(drawn["a"] - 0.75 * 2 * step) < 1 and abs(drawn["b"] - 0.25 * 2 * step) < 1
    assert drawn == Counter(a=30, b=10)
    # sizes other than the batch (dynamic sampling's extra groups, the stream's refills) keep the ratio too
    for size in (1, 3, 5, 7):
        drawn.update(t["source"] for t in sampler.next_batch(size))
        total = sum(drawn.values())
        assert abs(drawn["a"] - 0.75 * total) < 1


def test_at_2_to_1_a_batch_of_2_takes_1_1_then_2_0_and_never_0_2():
    """The share of each step: the source of ratio 1 never gets the whole batch, the one of ratio 2 never falls
    behind its share by a row."""
    sampler = SourceSampler(_rows("a", 9) + _rows("b", 9), 2, {"a": 2, "b": 1})
    steps = []
    for _ in range(12):
        batch = sampler.next_batch()
        steps.append((sum(t["source"] == "a" for t in batch), sum(t["source"] == "b" for t in batch)))
    assert steps == [(1, 1), (2, 0), (1, 1)] * 4
    assert (0, 2) not in steps


def test_val_max_tasks_is_spread_over_the_sources_by_ratio_in_each_sources_order():
    from openmanus_rl_core.data.sources import first_tasks

    tasks = _rows("a", 10) + _rows("b", 2) + _rows("c", 10)
    picked = first_tasks(tasks, 4, {"a": 3, "b": 1, "c": 1})
    assert [(t["source"], t["task_id"]) for t in picked] == [("a", 0), ("a", 1), ("b", 0), ("c", 0)]
    # b's share (6 of 10) is more than its 2 rows: the rest goes to the others
    picked = first_tasks(tasks, 10, {"a": 1, "b": 3, "c": 1})
    assert Counter(t["source"] for t in picked) == Counter(a=4, b=2, c=4)
    assert first_tasks(tasks, 4, None) == tasks[:4]  # a single env: the first rows, as before


def test_a_whole_sources_mapping_replaces_the_default_sources_and_a_plus_entry_adds_one():
    from omegaconf import OmegaConf

    from openmanus_rl_core.config.loading import compose

    def sources(*overrides: str) -> dict:
        return OmegaConf.to_container(compose(["env=mix", *overrides]).env.kwargs.sources)

    assert list(sources()) == ["key_door", "legs"]
    assert sources("env.kwargs.sources={a: {env: key_door, ratio: 2}, b: {env: word_copy}}") == {
        "a": {"env": "key_door", "ratio": 2}, "b": {"env": "word_copy"}}
    assert sources("env.kwargs.sources={a: {env: key_door}}", "env.kwargs.sources.a.ratio=5") == {
        "a": {"env": "key_door", "ratio": 5}}  # keys after it change the new mapping
    assert list(sources("+env.kwargs.sources.b={env: word_copy}")) == ["key_door", "legs", "b"]
    assert sources("env.kwargs.sources.key_door.ratio=1")["key_door"] == {"ratio": 1}


def test_a_source_without_an_oracle_is_left_out_of_the_corpus_and_the_warm_up_with_one_notice():
    """TextArena's Blackjack-v0 has no solver here; key_door has an oracle. The corpus keeps Blackjack's prompts
    and first observations, plays key_door's oracle episodes; the warm-up demonstrates key_door's tasks only."""
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.models.loading import build_tokenizer
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.run.warmup import build_corpus, build_demonstrations

    cfg = load(["env=mix", "env.kwargs.sources={blackjack: {env: textarena, kwargs: {game: Blackjack-v0}}, "
                "key_door: {}}"], training=False)
    make = lambda: build("env", cfg.env)  # noqa: E731
    template = build("template", cfg.template)
    tasks = [{"task_id": i, "seed": i, "source": s} for i in range(3) for s in ("blackjack", "key_door")]
    probe = make()
    assert probe.without_oracle == ["blackjack"] and hasattr(probe, "oracle_action")
    probe.start_task(tasks[0])
    assert not hasattr(probe, "oracle_action")  # Blackjack's task in play: no oracle, as Blackjack alone
    probe.start_task(tasks[1])
    assert hasattr(probe, "oracle_action")
    probe.close()

    corpus = build_corpus(make, template, tasks, max_turns=8)
    blackjack = build("env", {"name": "textarena", "kwargs": {"game": "Blackjack-v0"}})
    assert blackjack.reset(task_id=1, seed=1) in corpus
    assert template.render("open box") in corpus  # key_door's oracle played its first move
    logged: list[str] = []
    demos = build_demonstrations(make, template, build_tokenizer(corpus, vocab_size=400), tasks, 8,
                                 log=logged.append)
    assert len(demos) == 3  # the key_door tasks
    assert [line for line in logged if "oracle" in line] == [
        "warm-up: source blackjack of env=mix has no oracle: 3 of the 6 demonstration tasks are left out of the "
        "warm-up (and of the tokenizer corpus's played episodes)"]


def test_a_resumed_sampler_draws_what_the_uninterrupted_one_would():
    tasks = _rows("a", 7) + _rows("b", 4)
    whole = SourceSampler(tasks, 3, {"a": 2, "b": 1}, seed=9)
    first = SourceSampler(tasks, 3, {"a": 2, "b": 1}, seed=9)
    for _ in range(5):
        assert first.next_batch() == whole.next_batch()
    state = json.loads(json.dumps(first.state_dict()))  # plain values, as a checkpoint keeps them
    resumed = SourceSampler(tasks, 3, {"a": 2, "b": 1}, seed=9)
    resumed.load_state_dict(state)
    assert [resumed.next_batch() for _ in range(8)] == [whole.next_batch() for _ in range(8)]
    other = SourceSampler(_rows("a", 7) + _rows("c", 4), 3, {"a": 2, "c": 1})
    with pytest.raises(DataError, match=r"saved with the sources a, b but this run has a, c"):
        other.load_state_dict(state)


def test_rows_of_another_source_or_a_source_without_rows_are_refused():
    with pytest.raises(DataError, match=r"source='z', not one of the sources a, b"):
        SourceSampler(_rows("a", 2) + _rows("z", 1), 2, {"a": 1, "b": 1})
    with pytest.raises(DataError, match=r"no training task has source='b'"):
        SourceSampler(_rows("a", 2), 2, {"a": 1, "b": 1})


# ---------------------------------------------------------------------------------------- config, tasks, env
@pytest.mark.parametrize("override, line", [
    ("env.kwargs.sources.key_door.ratio=0", "env.kwargs.sources.key_door.ratio=0: must be a positive number"),
    ("env.kwargs.sources.key_door.ratio=-2", "env.kwargs.sources.key_door.ratio=-2: must be a positive number"),
    ("+env.kwargs.sources.legs.rate=1", "env.kwargs.sources.legs.rate: not a source setting"),
    ("+env.kwargs.sources.dice={env: dice_roll}", "env.kwargs.sources.dice.env: env=dice_roll: no such option"),
    ("env.kwargs.sources.legs.kwargs.dataset=leg_countin",
     "env.kwargs.sources.legs.kwargs.dataset=leg_countin: not a Reasoning Gym dataset; did you mean leg_counting"),
    ("+env.kwargs.sources.inner={env: mix}", "env.kwargs.sources.inner.env=mix: a source cannot be a mix itself"),
    ("+env.kwargs.sources.key_door.kwargs.colour=red",
     "env.kwargs.sources.key_door.kwargs.colour=red: unknown key of the env 'key_door'"),
    ("+env.kwargs.sources.key_door.reward=gaol", "env.kwargs.sources.key_door.reward: reward=gaol: no such option"),
    ("env.kwargs.sources.legs.reward=3", "env.kwargs.sources.legs.reward=3: must name a reward option"),
    ("+env.kwargs.sources.key_door.reward=reward_model",  # its model_path is ???, and a source's option is as shipped
     "env.kwargs.sources.key_door.reward: reward.components.rm.kwargs.model_path: Missing mandatory value"),
])
def test_a_bad_source_is_one_line_naming_it_before_anything_is_built(tmp_path, capsys, override, line):
    from openmanus_rl_core.cli import main

    assert main(["train", "env=mix", override, f"trainer.run_dir={tmp_path / 'run'}"]) == 2
    out = capsys.readouterr()
    printed = (out.out + out.err).strip().splitlines()
    assert len(printed) == 1 and line in printed[0], printed
    assert not (tmp_path / "run").exists()


def test_the_task_files_hold_each_sources_rows_as_its_env_alone_makes_them():
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.generation import split_rows

    train, val = split_rows(load(["env=mix", *SOURCES], training=False))
    assert Counter(r["source"] for r in train) == Counter(key_door=12, legs=12)
    assert Counter(r["source"] for r in val) == Counter(key_door=4, legs=4)
    legs_alone, _ = split_rows(load(["env=reasoning_gym", "env.kwargs.dataset=leg_counting", "env.train_tasks=12",
                                     "env.val_tasks=4"], training=False))
    assert [{k: v for k, v in r.items() if k != "source"} for r in train if r["source"] == "legs"] == legs_alone
    assert {r["env"] for r in train} == {"key_door", "reasoning_gym"}


def test_each_episode_plays_its_sources_env_with_its_instruction_and_turn_limit():
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.generation import split_rows
    from openmanus_rl_core.plugin.mix import MixEnv
    from openmanus_rl_core.plugin.registry import build

    cfg = load(["env=mix", *SOURCES, "+env.kwargs.sources.key_door.max_turns=2"], training=False)
    train, _ = split_rows(cfg)
    env = MixEnv(**cfg.env.kwargs)
    door = next(r for r in train if r["source"] == "key_door")
    legs = next(r for r in train if r["source"] == "legs")
    alone = build("env", {"name": "key_door", "kwargs": {}})
    assert env.start_task(door) == alone.reset(task_id=door["task_id"], seed=door["seed"])
    assert env.instruction == alone.instruction and env.source == "key_door"
    first = env.step("look around")
    assert not first.done
    second = env.step("look around")  # key_door's own limit here is 2 turns, within the mix's 4
    assert second.done and second.info["source_max_turns"] == 2
    obs = env.start_task(legs)
    assert legs["prompt"] in obs and "answer" in env.instruction.lower() and env.source == "legs"
    result = env.step(str(legs["ground_truth"]))
    assert result.done and result.info["success"] is True
    env.close()
    with pytest.raises(ValueError, match=r"source='elsewhere', not one of this mix's sources \(key_door, legs\)"):
        env.start_task({"task_id": 0, "seed": 0, "source": "elsewhere"})


def test_a_source_with_its_own_reward_option_is_scored_by_it_and_the_others_by_the_runs():
    from openmanus_rl_core.config.loading import load
    from openmanus_rl_core.data.generation import split_rows
    from openmanus_rl_core.plugin.mix import MixEnv, source_rewards
    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_core.rewards.composer import RewardComposer
    from openmanus_rl_core.protocols import ParsedAction, Trajectory, Turn

    cfg = load(["env=mix", *SOURCES], training=False)  # the option's default: legs scored by reward=reasoning_gym
    own = source_rewards(cfg)
    assert list(own) == ["legs"] and own["legs"]["goal"]["kwargs"] == {"use_score": True}
    assert source_rewards(load(["env=key_door"], training=False)) == {}
    assert source_rewards(SimpleNamespace(env=SimpleNamespace(name="agentgym_academia"))) == {}  # a factory object
    longer = load(["env=mix", *SOURCES, "rollout.max_new_tokens=300", "+env.kwargs.sources.key_door.reward=overlong"],
                  training=False)  # the option's ${rollout.max_new_tokens} is the run's, as under reward=overlong
    assert source_rewards(longer)["key_door"]["overlong"]["kwargs"]["max_length"] == 300
    template = build("template", cfg.template)
    composer = RewardComposer.from_config(cfg.reward.components, template=template, by_source=own)
    train, _ = split_rows(cfg)
    env = MixEnv(**cfg.env.kwargs)
    played = []
    for source in ("legs", "key_door"):  # a failed episode each, which its env scores 0.5 (partial credit)
        row = next(r for r in train if r["source"] == source)
        obs = env.start_task(row)
        result = env.step("7" if source == "legs" else "look around")
        turn = Turn(response="<action>x</action>", action=ParsedAction("action", "x", True), observation="",
                    reward=result.reward, done=True, info=dict(result.info, score=0.5), span=(0, 4))
        played.append(Trajectory(task_id=row["task_id"], seed=row["seed"], group_id=0, initial_observation=obs,
                                 turns=[turn], success=bool(result.info.get("success")), task=row))
    env.close()
    (legs, door), metrics = composer.compose_batch(played)
    assert set(legs.parts) == {"legs.goal", "legs.format", "legs.invalid_action"}
    assert set(door.parts) == {"goal", "format", "invalid_action"}
    alone = RewardComposer.from_config(load(["env=reasoning_gym", "reward=reasoning_gym"], training=False)
                                       .reward.components, template=template)
    assert legs.raw["legs.goal"] == 0.5 and door.raw["goal"] == 0.0  # the score; success alone
    assert legs.total == pytest.approx(alone.compose(played[0]).total)
    assert metrics["reward/legs.goal/raw_mean"] == 0.5 and metrics["reward/goal/raw_mean"] == 0.0


# ---------------------------------------------------------------------------------------------- end to end
def _records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def _cli(run_dir: Path, *extra: str) -> list[str]:
    return [str(BIN / "openmanus-rl"), "train", *SMALL, "trainer.total_steps=4", "trainer.save_freq=2",
            "trainer.val_freq=0", f"trainer.run_dir={run_dir}", *extra]


@pytest.mark.slow
def test_key_door_and_a_reasoning_gym_dataset_at_3_to_1_train_with_per_source_metrics(tmp_path, ray_local,
                                                                                      command_here):
    run = tmp_path / "run"
    # in this process (cli.main) on the tests' shared Ray; 4 of the 8 validation tasks (key_door's 4, then legs' 4)
    out = command_here(_cli(run, "trainer.val_max_tasks=4")[1:])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    records = {r["step"]: r for r in _records(run)}
    for step in (1, 2, 3, 4):  # a batch of 4 tasks x n=2: 3 key_door tasks and 1 legs task every step
        assert records[step]["train/key_door/episodes"] == 6 and records[step]["train/legs/episodes"] == 2
    final = records[4]
    assert final["val/key_door/episodes"] == 3 and final["val/legs/episodes"] == 1  # every source, at 3:1
    assert 0 <= final["val/legs/success_rate"] <= 1
    assert all(records[step]["rollout/termination/env_error"] == 0 for step in (1, 2, 3, 4))


@pytest.mark.long
def test_a_mix_killed_with_sigkill_resumes_with_an_unchanged_history(tmp_path, cli_env):
    full, killed = tmp_path / "full", tmp_path / "killed"
    subprocess.run(_cli(full), check=True, env=cli_env, capture_output=True, timeout=600)
    kill_once_written(_cli(killed), killed / "checkpoints" / "step_000002" / "COMPLETE", cli_env)
    subprocess.run(_cli(killed, "trainer.resume=auto"), check=True, env=cli_env, capture_output=True, timeout=600)
    a, b = _records(full), _records(killed)
    assert [r["step"] for r in b] == [r["step"] for r in a] == [0, 1, 2, 3, 4]
    import torch

    # where each source's draws stand after step 4: 4 steps of 3 key_door tasks and 1 legs task, alike in both
    states = [torch.load(run / "checkpoints" / "step_000004" / "sampler.pt", weights_only=True) for run in (full, killed)]
    assert states[0]["drawn"] == {"key_door": 12, "legs": 4} and states[1] == states[0]
    keys = [k for k in a[-1] if k.startswith(("train/key_door/", "train/legs/", "train/reward", "val/"))]
    for ra, rb in zip(a, b):
        for k in keys:
            if k in ra:
                assert rb[k] == pytest.approx(ra[k], rel=1e-6, abs=1e-6), (ra["step"], k)
