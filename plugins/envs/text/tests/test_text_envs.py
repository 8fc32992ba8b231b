"""Tests of the in-process text envs: oracle success, no credit for spam, determinism, total step()."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openmanus_rl_core.protocols import OracleEnv, StepResult
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.testing import check_env, check_oracle
from openmanus_rl_env_text import VOCAB, GuessNumberEnv, KeyDoorEnv, WordCopyEnv, hooks
from openmanus_rl_env_text.key_door import START

ENVS = {"word_copy": WordCopyEnv, "key_door": KeyDoorEnv, "guess_number": GuessNumberEnv}
CONFIG_DIR = Path(hooks.__file__).parent / "configs" / "env"


def run_oracle(env, task_id, seed=0, max_steps=10):
    env.reset(task_id, seed)
    total, steps = 0.0, 0
    while True:
        r = env.step(env.oracle_action())
        total, steps = total + r.reward, steps + 1
        if r.done or steps >= max_steps:
            return r, total, steps


# --------------------------------------------------------------------------------------- contract
@pytest.mark.parametrize("name", ENVS)
def test_registered_and_built_through_registry(name):
    env = registry("env").build(name)
    assert isinstance(env, ENVS[name]) and isinstance(env, OracleEnv)
    assert isinstance(env.instruction, str) and env.instruction
    assert isinstance(env.num_tasks, int) and env.num_tasks > 0


@pytest.mark.parametrize("name", ENVS)
def test_conformance_kit(name):
    env = ENVS[name]()
    env.reset(0, 0)
    actions = [env.oracle_action(), "open box", "say apple", "8", "apple"]
    check_env(ENVS[name], task_ids=[0, 1, None], actions=actions)
    check_oracle(ENVS[name], task_ids=list(range(env.num_tasks)), max_steps=6)


@pytest.mark.parametrize("name", ENVS)
def test_oracle_succeeds_on_every_task_within_config_turns(name):
    cfg = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
    env = ENVS[name](**cfg["kwargs"])
    for task_id in range(env.num_tasks):
        r, total, steps = run_oracle(env, task_id)
        assert r.done and r.info["success"] is True and r.info["invalid"] is False
        assert total == 1.0 and steps <= cfg["max_turns"], (task_id, steps)


@pytest.mark.parametrize("name", ENVS)
def test_deterministic(name):
    a, b = ENVS[name](), ENVS[name]()
    for task_id, seed in [(0, 0), (5, 3), (None, 7), (None, None), (3, None)]:
        assert a.reset(task_id, seed) == b.reset(task_id, seed)
        assert a.oracle_action() == b.oracle_action()
        for action in ["apple", "open box", "say cat", "5", b.oracle_action()]:
            assert a.step(action) == b.step(action)
    # task_id None draws from the seed; different seeds reach different tasks
    tasks = set()
    for s in range(40):
        a.reset(None, s)
        tasks.add(a.task)
    assert len(tasks) > 1


@pytest.mark.parametrize("name", ENVS)
def test_task_id_wraps_and_bad_task_id_is_named(name):
    env = ENVS[name]()
    env.reset(1, 0)
    o1 = env.oracle_action()
    env.reset(1 + env.num_tasks, 0)
    assert env.oracle_action() == o1
    with pytest.raises(ValueError, match="task_id"):
        env.reset("first", 0)


@pytest.mark.parametrize("name", ENVS)
def test_step_before_reset_and_after_done(name):
    env = ENVS[name]()
    r = env.step("anything")
    assert r.done and r.reward == 0.0 and r.info["invalid"]
    r, _, _ = run_oracle(env, 0)
    assert r.done
    again = env.step(env.oracle_action())
    assert again.done and again.reward == 0.0 and again.info["success"] is True
    env.close()
    env.close()


# --------------------------------------------------------------------------------------- word_copy
def test_word_copy_right_word_and_normalisation():
    env = WordCopyEnv()
    assert env.num_tasks == len(VOCAB) == 60
    for task_id in (0, 17, 59):
        obs = env.reset(task_id, 0)
        word = VOCAB[task_id]
        assert obs == f"Say: {word}" and len(obs.split()) == 2
        for variant in (word, f"  {word.upper()}\n", word.capitalize()):
            env.reset(task_id, 0)
            r = env.step(variant)
            assert (r.reward, r.done, r.info["success"], r.info["invalid"]) == (1.0, True, True, False)


def test_word_copy_spam_and_wrong_words_get_nothing():
    env = WordCopyEnv()
    for task_id, word in enumerate(VOCAB):
        other = VOCAB[(task_id + 1) % len(VOCAB)]
        for action in [other, f"{word} {word}", f"{word} {other}", " ".join(VOCAB), f"{word}.", f"say {word}",
                       f"<action>{word}</action>", "", word[:-1]]:
            env.reset(task_id, 0)
            r = env.step(action)
            assert r.reward == 0.0 and r.done and r.info["success"] is False, (word, action)
        env.reset(task_id, 0)
        assert env.step(" ".join(VOCAB)).info["invalid"] is True
        env.reset(task_id, 0)
        assert env.step(other).info["invalid"] is False  # one wrong word is a (wrong) answer


def test_word_copy_phrasings_and_vocab_size():
    env = WordCopyEnv(phrasings=3, vocab_size=10)
    assert env.num_tasks == 30
    obs = {env.reset(t, 0) for t in range(30)}
    assert len(obs) == 30
    assert env.reset(25, 0) == "Copy: " + VOCAB[5]
    custom = WordCopyEnv(words=["yes", "no"])
    assert custom.num_tasks == 2 and custom.reset(1, 0) == "Say: no"
    for bad in [dict(phrasings=0), dict(vocab_size=61), dict(words=[]), dict(words=["Two words"]), dict(words=["a", "a"])]:
        with pytest.raises(ValueError):
            WordCopyEnv(**bad)


# ---------------------------------------------------------------------------------------- key_door
def test_key_door_password_needs_the_observation():
    env = KeyDoorEnv()
    assert env.num_tasks == len(VOCAB)
    start_words = set(START.lower().replace(".", " ").replace(",", " ").split())
    for task_id, pw in enumerate(VOCAB):
        assert env.reset(task_id, 0) == START
        assert pw not in start_words
        r = env.step("open box")
        assert pw in r.observation and (r.reward, r.done, r.info["invalid"]) == (0.0, False, False)
        assert env.oracle_action() == f"say {pw}"
        r = env.step(f"  Say   {pw.upper()} ")
        assert (r.reward, r.done, r.info["success"]) == (1.0, True, True)


def test_key_door_wrong_and_spam_get_nothing():
    env = KeyDoorEnv()
    pw = VOCAB[3]
    env.reset(3, 0)
    env.step("open box")
    spam = ["say " + " ".join(VOCAB), f"say {pw} {pw}", f"say {pw} please", f"open box say {pw}",
            pw, "say", "", "open", "open box now", f"<action>say {pw}</action>", f"say {pw}\nsay {pw}"]
    for action in spam:
        r = env.step(action)
        assert (r.reward, r.done, r.info["invalid"]) == (0.0, False, True), action
    for action in [f"say {VOCAB[4]}", f"say {pw}.", f"say {pw[:-1]}", f"say {pw}{pw}"]:
        r = env.step(action)
        assert (r.reward, r.done, r.info["invalid"]) == (0.0, False, False), action
        assert r.observation == "Wrong word. The door stays locked."
    r = env.step("open box")  # reopening repeats the note
    assert pw in r.observation and r.reward == 0.0
    r = env.step(f"say {pw}")
    assert r.reward == 1.0 and r.info["success"]


def test_key_door_saying_without_opening_is_allowed_but_unknowable():
    env = KeyDoorEnv()
    env.reset(0, 0)
    assert env.oracle_action() == "open box"
    r = env.step(f"say {VOCAB[0]}")  # a lucky guess works: the env checks the word, not the order
    assert r.reward == 1.0 and r.done


# ------------------------------------------------------------------------------------ guess_number
def test_guess_number_feedback_and_range():
    env = GuessNumberEnv()
    assert env.num_tasks == 16
    assert env.reset(6, 0) == "Guess a number from 1 to 16."  # the number is 7
    r = env.step("3")
    assert r.observation == "3 is too low. Try 4 to 16." and r.reward == 0.0 and not r.done
    r = env.step("12")
    assert r.observation == "12 is too high. Try 4 to 11."
    assert env.oracle_action() == "7"
    r = env.step(" 07 ")
    assert (r.reward, r.done, r.info["success"]) == (1.0, True, True)


def test_guess_number_invalid_and_spam():
    env = GuessNumberEnv()
    env.reset(6, 0)
    for action in ["0", "17", "-3", "7 8", "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16", "seven", "7.0", "٧", "²",
                   "9" * 5000, "", "guess 7"]:
        r = env.step(action)
        assert (r.reward, r.done, r.info["invalid"]) == (0.0, False, True), action
    quiet = GuessNumberEnv(low=0, high=3, show_range=False)
    assert quiet.num_tasks == 4
    quiet.reset(2, 0)
    assert quiet.step("1").observation == "1 is too low."
    with pytest.raises(ValueError):
        GuessNumberEnv(low=5, high=5)


# ------------------------------------------------------------------------------ arbitrary input
text_actions = st.one_of(
    st.text(max_size=300),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=50),
    st.text(alphabet=st.characters(max_codepoint=0x1F), max_size=50),  # control characters
    st.sampled_from(["open box", "say apple", "8", "apple", "", "\x00", "say \u2028apple"]),
    st.builds(lambda c, n: c * n, st.sampled_from(["a", " ", "say ", "{", "\n", "9"]), st.integers(0, 200_000)),
)


@pytest.mark.parametrize("name", ENVS)
@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(task_id=st.one_of(st.none(), st.integers(-10**6, 10**6)), seed=st.one_of(st.none(), st.integers(0, 2**32)),
       actions=st.lists(text_actions, min_size=1, max_size=6))
def test_step_takes_any_text(name, task_id, seed, actions):
    env = ENVS[name]()
    assert isinstance(env.reset(task_id, seed), str)
    total = 0.0
    for action in actions:
        r = env.step(action)
        assert isinstance(r, StepResult) and isinstance(r.observation, str) and isinstance(r.done, bool)
        assert isinstance(r.reward, float) and math.isfinite(r.reward)
        assert isinstance(r.info.get("invalid"), bool)
        assert len(r.observation) < 200  # never echoes a huge action back
        if r.done:
            assert isinstance(r.info["success"], bool)
        total += r.reward
    assert total <= 1.0  # one success per episode, no credit to collect twice


@pytest.mark.parametrize("name", ENVS)
def test_non_str_actions_do_not_raise(name):
    env = ENVS[name]()
    for junk in [None, b"\xff\xfeapple", 7, 3.5, ["say", "apple"], object()]:
        env.reset(0, 0)
        assert isinstance(env.step(junk), StepResult)


# --------------------------------------------------------------------------------------- configs
def test_configs_and_hook():
    dirs = hooks.openmanus_rl_config_dirs()
    assert dirs == [str(CONFIG_DIR.parent)]
    for name in ENVS:
        cfg = yaml.safe_load((CONFIG_DIR / f"{name}.yaml").read_text())
        assert set(cfg) == {"name", "kwargs", "max_turns", "train_tasks", "val_tasks"}
        assert cfg["name"] == name
        env = registry("env").build(cfg["name"], **cfg["kwargs"])
        assert env.num_tasks > 0 and cfg["max_turns"] >= 1 and cfg["train_tasks"] > 0 and cfg["val_tasks"] > 0


# ------------------------------------------------------------------------------------------------ relay
def test_relay_conforms_and_its_oracle_runs_the_whole_relay():
    from openmanus_rl_env_text.relay import RelayEnv

    check_env(lambda: RelayEnv(length=5, padding=1, num_tasks=10), task_ids=[0, 1, None], actions=["say apple"])
    check_oracle(lambda: RelayEnv(length=5, padding=1, num_tasks=10), task_ids=list(range(10)), max_steps=5)


def test_relay_needs_every_station_and_pays_a_share_per_station():
    from openmanus_rl_env_text.relay import RelayEnv

    env = RelayEnv(length=3, padding=2, num_tasks=10)
    obs = env.reset(task_id=4)
    assert "Station 1 of 3." in obs and obs.count("The") >= 3  # two scenery sentences, then the sign
    word = obs.rsplit(": ", 1)[1].rstrip(".")
    wrong = env.step("say nothingness")
    assert (wrong.reward, wrong.done, wrong.info["invalid"]) == (0.0, False, False) and "Station 1 of 3" in wrong.observation
    assert env.step("jump").info["invalid"] is True
    r = env.step(f"say {word}")
    assert r.reward == pytest.approx(1 / 3) and "Station 2 of 3" in r.observation and not r.done
    env.step(env.oracle_action())
    last = env.step(env.oracle_action())
    assert last.done and last.info["success"] is True and last.reward == pytest.approx(1 / 3)


@pytest.mark.parametrize("kwargs, bad", [({"length": 0, "padding": 1, "num_tasks": 1}, "length=0"),
                                         ({"length": 2, "padding": -1, "num_tasks": 1}, "padding=-1")])
def test_relay_bad_kwargs_are_named(kwargs, bad):
    from openmanus_rl_env_text.relay import RelayEnv

    with pytest.raises(ValueError, match=bad):
        RelayEnv(**kwargs)
