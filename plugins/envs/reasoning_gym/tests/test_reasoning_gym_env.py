"""env=reasoning_gym: items as tasks, the dataset's own score_answer as the reward (checked against Reasoning Gym
itself on 220 items, malformed replies included, through the rollout loop and the reward composer), the hint after a
wrong answer, a weighted mix, data make, settings checked before a run, and training from the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import reasoning_gym
from reasoning_gym.composite import DatasetSpec

from openmanus_rl_core.commands.data import make as make_data
from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.data.tasks import load_tasks
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.protocols import OracleEnv
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig
from openmanus_rl_core.testing import ScriptedEngine, check_env, check_oracle
from openmanus_rl_env_reasoning_gym import DEFAULT_INSTRUCTION, ReasoningGymEnv, datasets

MIX = {"leg_counting": 1, "spell_backward": 1, "chain_sum": 1}


def reference(name, size=10000, seed=0, **config):
    """The dataset as Reasoning Gym itself builds it (not through the plugin)."""
    if isinstance(name, dict):
        specs = [DatasetSpec(name=n, weight=w, config=dict(config.get(n, {}))) for n, w in name.items()]
        return reasoning_gym.create_dataset("composite", size=size, seed=seed, datasets=specs)
    return reasoning_gym.create_dataset(name, size=size, seed=seed, **config)


def reference_score(ds, answer, entry):
    """``ds.score_answer``; a scorer that raises counts 0 (the env's rule), and is reported as raised."""
    try:
        return float(ds.score_answer(answer, entry)), False
    except Exception:  # noqa: BLE001
        return 0.0, True


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [reference(n, size=10)[i]["question"] for n in MIX for i in range(5)]
    return build_tokenizer(corpus + ["<think>", "<action>", "</action>", "Score 0.00 of 1"], vocab_size=400)


@pytest.fixture(scope="module")
def composer_and_template():
    cfg = load(["env=reasoning_gym", "reward=reasoning_gym"], training=False)
    template = registry("template").build(cfg.template.name, **dict(cfg.template.kwargs))
    return RewardComposer.from_config(cfg.reward.components, template), template


def play(env_factory, template, tokenizer, tasks, replies, max_turns=1):
    """Trajectories of ``tasks`` (``{task_id, seed}``) with the scripted ``replies`` (one list per turn)."""
    loop = AgentLoop(ScriptedEngine(tokenizer, replies), tokenizer, template, env_factory,
                     RolloutConfig(max_turns=max_turns, max_new_tokens=2048, max_response_tokens=8192,
                                   max_prompt_tokens=8192, max_obs_tokens=512))
    return [e.trajectory for e in loop.run([dict(t, group_id=i) for i, t in enumerate(tasks)])], loop


# ----------------------------------------------------------------------------------------------- contract
def test_registered_built_from_its_config_and_an_oracle_env():
    cfg = load(["env=reasoning_gym"], training=False)
    assert cfg.env.name == "reasoning_gym" and cfg.env.max_turns == 1
    assert cfg.env.kwargs["max_attempts"] == 1 and cfg.env.kwargs["dataset"] == "leg_counting"
    env = registry("env").build("reasoning_gym", **cfg.env.kwargs)
    assert isinstance(env, ReasoningGymEnv) and isinstance(env, OracleEnv)
    assert env.num_tasks == 10000 >= cfg.env.train_tasks + cfg.env.val_tasks
    assert env.instruction == DEFAULT_INSTRUCTION
    assert load(["env=reasoning_gym", "env.max_turns=3"], training=False).env.kwargs["max_attempts"] == 3
    reward = load(["env=reasoning_gym", "reward=reasoning_gym"], training=False).reward.components
    assert reward["goal"]["kwargs"] == {"use_score": True} and set(reward) == {"goal", "format", "invalid_action"}


def test_task_id_is_reasoning_gyms_own_item():
    env = ReasoningGymEnv(dataset="leg_counting", config={"max_animals": 4}, size=50, seed=7)
    ref = reference("leg_counting", size=50, seed=7, max_animals=4)
    for t in (0, 1, 49):
        assert env.reset(t, seed=123) == ref[t]["question"] and env.oracle_action() == ref[t]["answer"]
    assert env.reset(None, seed=3) == env.reset(None, seed=3)  # a seeded random item
    with pytest.raises(ValueError, match=r"task_id 50 is out of range.*size 50"):
        env.reset(50)
    with pytest.raises(ValueError, match="task_id must be an int"):
        env.reset("3")


def test_conformance_kit():
    check_env(lambda: ReasoningGymEnv(dataset="leg_counting"), task_ids=[0, 1, 9999, None], actions=["42", "7 legs"])
    check_env(lambda: ReasoningGymEnv(dataset=MIX, max_attempts=3), task_ids=[0, 5], actions=["", "x", "12"])
    for dataset in ("leg_counting", "spell_backward", "chain_sum", "word_sorting", MIX):
        check_oracle(lambda: ReasoningGymEnv(dataset=dataset), task_ids=list(range(20)), max_steps=1)
    check_oracle(lambda: ReasoningGymEnv(dataset="gcd", max_attempts=3), task_ids=list(range(5)), max_steps=3)


def test_datasets_without_reference_answers_have_no_oracle():
    env = ReasoningGymEnv(dataset="rush_hour")
    assert not hasattr(env, "oracle_action")  # what the warm-up and the tokenizer corpus ask: they skip the oracle
    ref = reference("rush_hour")
    assert env.reset(0) == ref[0]["question"] and ref[0]["answer"] is None
    r = env.step("garbage")  # still scored by the dataset (rush_hour gives a wrong move sequence 0.01)
    assert r.done and r.info["score"] == r.reward == ref.score_answer("garbage", ref[0])


# ------------------------------------------------------------------------------------ rewards = score_answer
DATASETS = ["leg_counting", "spell_backward", "chain_sum", "basic_arithmetic", "word_sorting", "number_sorting",
            "caesar_cipher", "prime_factorization", "letter_counting", "gcd", MIX]
ITEMS = 20


def replies_for(answer):
    """``(reply, the answer the env receives)``: what the react template hands the env for each reply (the first
    complete action block, stripped; a reply without one, or with an empty one, arrives whole)."""
    garbage = "zzq ### 17 !! \x00\ufffd漢🙂"
    half = answer[: max(1, len(answer) // 2)].strip()
    return [
        (f"<think>easy</think><action>{answer}</action>", answer),                        # right
        (f"<action>{answer} because I counted twice</action>", f"{answer} because I counted twice"),  # + extra text
        (f"<action>  {answer}  </action> and some words after", answer),                 # runs on after the action
        (f"The answer is {answer}.", f"The answer is {answer}."),                          # no tags
        (f"<answer>{answer}</answer>", f"<answer>{answer}</answer>"),                      # the wrong tags
        (f"<action>{answer}", f"<action>{answer}"),                                        # unclosed
        ("<action></action>", "<action></action>"),                                        # empty action
        (f"<action>{garbage}</action>", garbage),                                          # garbage
        (f"<action>{answer[::-1]}9</action>", f"{answer[::-1]}9"),                         # wrong
        (f"<action>{half}</action>", half),                                                # half of it
        (f"<action>{answer.upper()}</action>", answer.upper()),                            # case
        (f"<action>no idea</action><action>{answer}</action>", "no idea"),                # two actions: the first
    ]


def test_rewards_equal_score_answer_on_220_items_malformed_replies_included(tokenizer, composer_and_template):
    """Each reply goes through the rollout loop (the react template's parse, env.step) and the reward=reasoning_gym
    composer; its goal reward must equal Reasoning Gym's own ``score_answer`` of the answer the env received, and
    the trajectory's success must be ``score >= 1``. A blank reply never reaches the env (the loop ends it as
    invalid): its reward 0 must equal ``score_answer(None, entry)``, Reasoning Gym's score of a reply without an
    answer."""
    composer, template = composer_and_template
    items = compared = raised = partial = 0
    for dataset in DATASETS:
        ref = reference(dataset)
        tasks, replies, expected = [], [], []
        for i in range(ITEMS):
            entry = ref[i]
            variants = replies_for(entry["answer"]) + [("   ", None)]  # a blank reply is no answer at all
            for reply, answer in variants:
                tasks.append({"task_id": i, "seed": 0})
                replies.append(reply)
                expected.append((i, answer, *reference_score(ref, answer, entry)))
        trajs, _ = play(lambda: ReasoningGymEnv(dataset=dataset), template, tokenizer, tasks, [replies])
        breakdowns, _ = composer.compose_batch(trajs)
        for traj, b, (i, answer, score, did_raise) in zip(trajs, breakdowns, expected):
            where = f"{dataset} item {i}, answer {answer!r}"
            if answer is not None:
                assert traj.turns[-1].action.content == answer, where
                assert traj.turns[-1].info["score"] == score, where
                assert bool(traj.success) == (score >= 1.0), where
                assert ("score_error" in traj.turns[-1].info) == did_raise, where
            assert b.raw["goal"] == score == traj.env_reward, where
            compared += 1
            raised += did_raise
            partial += 0.0 < score < 1.0
        items += ITEMS
    print(f"\nreward == score_answer on {items} items, {compared} replies ({raised} where score_answer raised, "
          f"{partial} with partial credit)")
    assert items >= 200 and compared == items * 13
    assert raised > 0 and partial > 0  # malformed answers that the scorers reject or half-credit are in the set


# ------------------------------------------------------------------------------------------- several turns
def test_a_wrong_answer_gets_its_score_and_a_hint_and_the_episode_goes_on(tokenizer, composer_and_template):
    composer, template = composer_and_template
    ref = reference("spell_backward")
    answers = [ref[i]["answer"] for i in range(2)]
    turn1 = ["<action>qqqq</action>", "<action>zzzz</action>"]
    turn2 = [f"<action>{answers[0][:2]}</action>", "<action>   </action>"]
    turn3 = [f"<action>{answers[0]}</action>", "<action>still wrong</action>"]
    trajs, loop = play(lambda: ReasoningGymEnv(dataset="spell_backward", max_attempts=3), template, tokenizer,
                       [{"task_id": 0, "seed": 0}, {"task_id": 1, "seed": 0}], [turn1, turn2, turn3], max_turns=3)
    solved, failed = trajs
    assert [t.info["score"] for t in solved.turns] == [
        ref.score_answer("qqqq", ref[0]), ref.score_answer(answers[0][:2], ref[0]), 1.0]
    first = solved.turns[0].observation
    assert first.startswith("Score 0.00 of 1 (attempt 1 of 3).") and "The answer is wrong." in first
    assert "answer again" in first and answers[0] not in first  # a hint, never the answer
    assert "partly right" in solved.turns[1].observation
    assert solved.termination == "done" and solved.success is True and solved.num_turns == 3
    assert failed.turns[1].action.content == "<action>   </action>"  # no answer in it: it arrives whole
    assert "The answer is wrong." in failed.turns[1].observation
    assert failed.turns[2].observation.endswith("No attempts left.") and failed.success is False
    assert failed.termination == "done" and failed.turns[2].done
    # the model reads the hint before its next answer
    assert first in loop.engine.prompts[1][0]
    # rewards are score deltas: the episode's env reward is its last answer's score, and so is the goal reward
    breakdowns, _ = composer.compose_batch(trajs)
    assert solved.env_reward == pytest.approx(1.0) and breakdowns[0].raw["goal"] == 1.0
    assert breakdowns[1].raw["goal"] == failed.turns[-1].info["score"] == pytest.approx(failed.env_reward)


def test_the_episode_ends_at_once_on_success_and_after_the_last_attempt():
    env = ReasoningGymEnv(dataset="gcd", max_attempts=2)
    env.reset(3)
    r = env.step(env.oracle_action())
    assert r.done and r.info["success"] and r.observation == "Score 1.00 of 1 (attempt 1 of 2). Correct."
    assert env.step("again").info["invalid"] is True
    env.reset(3)
    first = env.step("")
    assert not first.done and first.info["score"] == 0.0 and "The answer was empty." in first.observation
    assert env.step("y").done


# ------------------------------------------------------------------------------------------------- a mix
def test_a_weighted_mix_is_reasoning_gyms_composite():
    weights = {"leg_counting": 1, "chain_sum": 3}
    config = {"chain_sum": {"max_terms": 2}}
    env = ReasoningGymEnv(dataset=weights, config=config, size=400)
    ref = reference(weights, size=400, **config)
    sources = []
    for t in range(200):
        assert env.reset(t) == ref[t]["question"]
        sources.append(env.source)
        assert env.step(ref[t]["answer"]).info == {"dataset": sources[-1], "item": t, "score": 1.0,
                                                   "success": True, "attempt": 1}
    share = sources.count("chain_sum") / len(sources)
    assert 0.65 < share < 0.85  # 3:1
    assert {ref[t]["metadata"]["num_terms"] for t in range(200) if sources[t] == "chain_sum"} <= {2}  # its config


# ------------------------------------------------------------------------------------------- data make
def test_data_make_writes_the_items(tmp_path):
    cfg = load(["env=reasoning_gym", "env.kwargs.dataset={leg_counting:1,spell_backward:1}", "env.kwargs.size=100",
                "env.train_tasks=20", "env.val_tasks=6", f"data.dir={tmp_path}"], training=False)
    assert make_data(cfg) == 0
    train, val = load_tasks(tmp_path / "train.parquet"), load_tasks(tmp_path / "val.parquet")
    assert [t["task_id"] for t in train] == list(range(20)) and [t["task_id"] for t in val] == list(range(20, 26))
    ref = reference({"leg_counting": 1, "spell_backward": 1}, size=100)
    for row in train + val:
        entry = ref[row["task_id"]]
        assert row["prompt"] == entry["question"] and row["ground_truth"] == entry["answer"]
        assert row["data_source"] == entry["metadata"]["source_dataset"] and row["env"] == "reasoning_gym"
        meta = json.loads(row["metadata"])
        assert meta["source_index"] == entry["metadata"]["source_index"]
        # the row is the entry score_answer takes
        rebuilt = {"question": row["prompt"], "answer": row["ground_truth"], "metadata": meta}
        assert ref.score_answer(row["ground_truth"], rebuilt) == 1.0
    assert {r["data_source"] for r in train + val} == {"leg_counting", "spell_backward"}


# ------------------------------------------------------------------------------------- settings checked
@pytest.mark.parametrize("override, line", [
    ("env.kwargs.dataset=leg_countin", r"^env\.kwargs\.dataset=leg_countin: not a Reasoning Gym dataset; did you "
                                       r"mean leg_counting"),
    ("env.kwargs.dataset=composite", r"^env\.kwargs\.dataset=composite: give the mix itself"),
    ("env.kwargs.config.max_animal=3", r"^env\.kwargs\.config\.max_animal=3: not a setting of the Reasoning Gym "
                                       r"dataset 'leg_counting'; did you mean max_animals\?"),
    ("env.kwargs.config.max_animals=0", r"^env\.kwargs\.config=\{\"max_animals\": 0\}: the Reasoning Gym dataset "
                                        r"'leg_counting' refuses these settings: max_animals must be >= min_animals"),
    ("env.kwargs.config.seed=3", r"^env\.kwargs\.config\.seed=3: set env\.kwargs\.seed instead"),
    ("env.kwargs.dataset={leg_counting:1,chain_sum:0}", r"^env\.kwargs\.dataset\.chain_sum=0: a weight must be"),
    ("env.kwargs.dataset=null", r"^env\.kwargs\.dataset=null: required"),
    ("env.kwargs.size=0", r"^env\.kwargs\.size=0: must be an integer >= 1"),
    ("env.kwargs.success_threshold=2", r"^env\.kwargs\.success_threshold=2: must be a number in \(0, 1\]"),
])
def test_bad_settings_are_one_line_before_anything_starts(override, line):
    with pytest.raises(ConfigError, match=line):
        load(["env=reasoning_gym", override], training=False)


def test_a_mix_checks_each_datasets_settings():
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.config\.chain_sun=.*did you mean chain_sum\?"):
        load(["env=reasoning_gym", "env.kwargs.dataset={leg_counting:1,chain_sum:3}",
              "env.kwargs.config={chain_sun:{max_terms:3}}"], training=False)
    with pytest.raises(ConfigError, match=r"^env\.kwargs\.config\.chain_sum\.max_term=3: not a setting"):
        load(["env=reasoning_gym", "env.kwargs.dataset={leg_counting:1,chain_sum:3}",
              "env.kwargs.config={chain_sum:{max_term:3}}"], training=False)


def test_an_unknown_dataset_stops_the_command_with_exit_2_before_a_run_folder(tmp_path, command_here):
    proc = command_here(["train", "env=reasoning_gym", "env.kwargs.dataset=leg_countin",
                         f"trainer.run_dir={tmp_path / 'run'}"])  # the console script's main, in this process
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and "env.kwargs.dataset=leg_countin: not a Reasoning Gym dataset" in lines[0]
    assert not (tmp_path / "run").exists()


# ---------------------------------------------------------------------------------------- processes agree
def test_items_are_the_same_in_every_process_and_hash_dependent_datasets_need_a_hash_seed(monkeypatch):
    code = ("import json, warnings; warnings.simplefilter('ignore')\n"
            "import reasoning_gym\n"
            "from openmanus_rl_env_reasoning_gym import ReasoningGymEnv\n"
            "env = ReasoningGymEnv(dataset=%r)\n"
            "ours = [env.reset(t) for t in range(6)]\n"
            "ladder = [reasoning_gym.create_dataset(n, size=6, seed=3)[t]['question'] for n in "
            "('word_ladder', 'ransom_note') for t in range(4)]\n"
            "print(json.dumps([ours, ladder]))" % (MIX,))
    outs = [json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                                      timeout=300, env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout)
            for h in (1, 2)]
    assert outs[0][0] == outs[1][0] == [ReasoningGymEnv(dataset=MIX).reset(t) for t in range(6)]
    assert outs[0][1] != outs[1][1]  # why HASH_DEPENDENT exists
    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    with pytest.raises(ValueError, match=r"^dataset=word_ladder: its items depend on Python's string hashing"):
        ReasoningGymEnv(dataset="word_ladder")
    monkeypatch.setenv("PYTHONHASHSEED", "0")
    assert ReasoningGymEnv(dataset="word_ladder").num_tasks == 10000
    assert {"word_ladder", "ransom_note"} <= datasets.HASH_DEPENDENT


# ------------------------------------------------------------------------------ trained from the command line
def train_from_the_command_line(command_here, tmp_path, *overrides):
    """A 2-step GRPO run of the tiny model (the small settings of the other env plugins' command-line runs), with
    reward=reasoning_gym, run in this process (the console script's main, on the module's local Ray). Returns
    (metrics records, validation episodes of the last step, seconds)."""
    import time

    run_dir = tmp_path / "run"
    cmd = ["train", "env=reasoning_gym", "reward=reasoning_gym", *overrides,
           "env.train_tasks=64", "env.val_tasks=8", "trainer.total_steps=2", "data.train_batch_size=4",
           "algorithm.n=2", "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2",
           "model.tiny.num_kv_heads=1", "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400",
           "model.corpus_tasks=8", "rollout.max_new_tokens=24", "warmup.steps=80", "warmup.num_demos=32",
           "warmup.validate=false", "trainer.num_workers=1", "trainer.loggers=[]", "trainer.progress=false",
           "trainer.save_at_end=false", f"trainer.run_dir={run_dir}"]
    t0 = time.perf_counter()
    proc = command_here(cmd)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    episodes = [json.loads(x) for x in (run_dir / "validation" / "val_step_000002.jsonl").read_text().splitlines()
                if x.strip()]
    final = {k: round(records[-1][k], 3) for k in ("train/reward_mean", "train/reward/goal/raw_mean",
                                                   "val/reward_mean", "val/reward/goal/mean", "val/success_rate")}
    print(f"\n{' '.join(overrides)}: {seconds:.0f}s; final {final}")
    return records, episodes, seconds


def check_run(records, episodes, dataset, config, max_turns=1):
    """Two logged steps; each step's goal reward is the env's score; every validation episode's goal reward is
    Reasoning Gym's own score_answer of its last answer."""
    assert [r["step"] for r in records] == [0, 1, 2]
    for r in records[1:]:
        assert r["train/reward/goal/raw_mean"] == pytest.approx(r["rollout/env_reward/mean"])
        assert 0.0 <= r["train/success_rate"] <= 1.0
    ref = reference(dataset, **config)
    assert len(episodes) == 8
    for ep in episodes:
        stepped = [t for t in ep["turns"] if "score" in t["info"]]
        expected = reference_score(ref, stepped[-1]["action"]["content"], ref[ep["task_id"]])[0] if stepped else 0.0
        assert ep["reward_parts"]["goal"] == expected and len(ep["turns"]) <= max_turns
    if max_turns > 1:  # the env ends each episode (success, or its last attempt); a miss before that gets a hint
        again = [ep for ep in episodes if len(ep["turns"]) > 1]
        assert again and all(ep["termination"] in ("done", "invalid", "truncated") for ep in episodes)
        assert all("answer again" in ep["turns"][0]["observation"] for ep in again)


@pytest.mark.slow
def test_leg_counting_trains_from_the_command_line(tmp_path, ray_local, command_here):
    records, episodes, _ = train_from_the_command_line(command_here, tmp_path, "env.kwargs.dataset=leg_counting",
                                                       "env.kwargs.config.max_animals=3")
    check_run(records, episodes, "leg_counting", {"max_animals": 3})


@pytest.mark.long
def test_spell_backward_trains_from_the_command_line(tmp_path, ray_local, command_here):
    records, episodes, _ = train_from_the_command_line(command_here, tmp_path, "env.kwargs.dataset=spell_backward",
                                                       "env.kwargs.config.max_word_len=5")
    check_run(records, episodes, "spell_backward", {"max_word_len": 5})


@pytest.mark.long
def test_chain_sum_with_three_attempts_trains_from_the_command_line(tmp_path, ray_local, command_here):
    records, episodes, _ = train_from_the_command_line(command_here, tmp_path, "env.kwargs.dataset=chain_sum",
                                                       "env.kwargs.config.max_terms=2", "env.max_turns=3")
    check_run(records, episodes, "chain_sum", {"max_terms": 2}, max_turns=3)


def test_envs_built_on_several_threads_at_once_in_a_fresh_process_all_see_every_dataset():
    """A rollout starts its episodes on several threads: the first ones import reasoning_gym together, and none may
    see the dataset registry half filled (it fills while the package imports)."""
    # the threads arrive one by one while the first one's import runs (about 2 s), as episodes start
    code = ("import threading, time\n"
            "from openmanus_rl_env_reasoning_gym.datasets import dataset_names\n"
            "seen, threads = [], []\n"
            "for _ in range(30):\n"
            "    threads.append(threading.Thread(target=lambda: seen.append(len(dataset_names()))))\n"
            "    threads[-1].start(); time.sleep(0.05)\n"
            "[t.join() for t in threads]\n"
            "print(sorted(set(seen)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == f"[{len(datasets.dataset_names())}]"
