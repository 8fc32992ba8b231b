"""env=textarena: TextArena's single-player games played through the rollout loop, each episode's observations,
invalid moves and reward checked against TextArena itself replaying the same moves (GuessTheNumber, TowerOfHanoi,
Blackjack, Minesweeper: many episodes at once, games that draw cards and mines while they are played included),
illegal and hostile moves answered and never raised, the oracles, bad settings refused in one line before a run
starts, and a 3-step training run from the command line scored with TextArena's reward."""

from __future__ import annotations

import contextlib
import json
import os
import random
import re
import subprocess
import sys

import pytest
import textarena as ta

from openmanus_rl_core.config import ConfigError
from openmanus_rl_core.config.loading import load
from openmanus_rl_core.models.loading import build_tokenizer
from openmanus_rl_core.plugin.registry import registry
from openmanus_rl_core.protocols import OracleEnv
from openmanus_rl_core.rewards.composer import RewardComposer
from openmanus_rl_core.rollout import AgentLoop, RolloutConfig
from openmanus_rl_core.testing import ScriptedEngine, check_env, check_oracle
from openmanus_rl_core.testing.common import hostile_texts
from openmanus_rl_env_textarena import DEFAULT_INSTRUCTION, TextArenaEnv, games
from openmanus_rl_env_textarena.oracles import _hanoi

HANOI_BOARD = re.compile(r"A: \[([\d, ]*)\]\nB: \[([\d, ]*)\]\nC: \[([\d, ]*)\]")


def textarena_play(game, seed, actions, config=None):
    """TextArena alone, as it ships: ``ta.make(game)`` with its default wrappers, ``reset(num_players=1, seed)``,
    the same moves. Returns ``(first observation, [(done, what the step added to the player's view, invalid)],
    reward or None, game_info)``: the view is its ``LLMObservationWrapper`` history, a move is invalid when TextArena
    says so (its "You attempted an invalid move" message, or ``invalid_move`` in the result that ends the game)."""
    env = ta.make(game, **(config or {}))
    env.reset(num_players=1, seed=seed)
    _, seen = env.get_observation()
    first, steps, done = seen, [], False
    for action in actions:
        done, _ = env.step(action)
        _, view = env.get_observation()
        added, seen = view[len(seen):], view
        info = env.state.game_info[0]
        steps.append((done, added, "You attempted an invalid move" in added or bool(done and info["invalid_move"])))
        if done:
            break
    rewards, game_info = env.close() if done else (None, None)
    return first, steps, (rewards or {}).get(0) if done else None, game_info


# ------------------------------------------------------------------------------------------- the player
class Player:
    """The moves of a game for a scripted engine: each reply is drawn (seeded) from the game's moves, malformed replies
    included; for TowerOfHanoi, often the solver's move for the last board in the prompt."""

    GARBAGE = ["I think I will go with this one.", "<action></action>", "<action>no idea</action>", "[", "]]][[",
               "<action>\x00🙂</action>"]

    def __init__(self, game, seed=0):
        self.game, self.rng = game, random.Random(seed)

    def move(self, prompt):
        r = self.rng
        if r.random() < 0.15:
            return r.choice(self.GARBAGE)
        if self.game.startswith("GuessTheNumber"):
            return r.choice([f"<action>[{r.randint(1, 20)}]</action>", f"<action>{r.randint(1, 20)}</action>",
                             f"<action>[{r.choice([0, 21, 99])}]</action>", f"My guess is [{r.randint(1, 20)}]"])
        if self.game.startswith("TowerOfHanoi"):
            boards = HANOI_BOARD.findall(prompt)
            if boards and r.random() < 0.75:
                where = {int(d): peg for peg, disks in zip("ABC", boards[-1]) for d in disks.split(",") if d.strip()}
                move = _hanoi(where, 3, "C")
                if move:
                    return f"<action>[{move[0]} {move[1]}]</action>"
            return f"<action>[{r.choice('ABC')} {r.choice('ABCD')}]</action>"
        if self.game.startswith("Blackjack"):
            return r.choice(["<action>[Hit]</action>", "<action>[Stand]</action>", "<action>stand</action>",
                             "<action>hit me</action>"])
        if self.game.startswith("Minesweeper"):
            return f"<action>[{r.randint(0, 5)} {r.randint(0, 5)}]</action>"
        raise AssertionError(self.game)


@pytest.fixture(scope="module")
def tokenizer():
    corpus = [TextArenaEnv(game=g).reset(0) for g in ("GuessTheNumber-v0", "TowerOfHanoi-v0", "Blackjack-v0")]
    return build_tokenizer(corpus + ["<think>", "<action>", "</action>", "[GAME] You attempted an invalid move."],
                           vocab_size=600)


@pytest.fixture(scope="module")
def composer_and_template():
    cfg = load(["env=textarena", "reward=textarena"], training=False)
    template = registry("template").build(cfg.template.name, **dict(cfg.template.kwargs))
    return RewardComposer.from_config(cfg.reward.components, template), template


def play(game, template, tokenizer, tasks, seed=0, max_turns=40):
    """Trajectories of ``tasks`` (``{task_id, seed}``), every episode live at once (one env call thread each)."""
    loop = AgentLoop(ScriptedEngine(tokenizer, Player(game, seed).move), tokenizer, template, lambda: TextArenaEnv(game=game),
                     RolloutConfig(max_turns=max_turns, max_new_tokens=256, max_response_tokens=65536,
                                   max_prompt_tokens=8192, max_obs_tokens=4096))
    return [e.trajectory for e in loop.run([dict(t, group_id=i) for i, t in enumerate(tasks)])]


# ----------------------------------------------------------------------------------------------- contract
def test_registered_built_from_its_config_with_an_oracle_where_the_game_has_a_solver():
    cfg = load(["env=textarena"], training=False)
    assert cfg.env.name == "textarena" and cfg.env.kwargs["game"] == "GuessTheNumber-v0" and cfg.env.max_turns == 16
    env = registry("env").build("textarena", **cfg.env.kwargs)
    assert isinstance(env, TextArenaEnv) and isinstance(env, OracleEnv) and env.instruction == DEFAULT_INSTRUCTION
    assert env.spec.cls == "GuessTheNumberEnv"
    reward = load(["env=textarena", "reward=textarena"], training=False).reward.components
    assert reward["goal"]["kwargs"] == {"use_score": True} and set(reward) == {"goal", "format", "invalid_action"}
    for game in ("Minesweeper-v0-small", "Blackjack-v0", "Mastermind-v0"):
        assert not hasattr(TextArenaEnv(game=game), "oracle_action")  # the warm-up skips such games
    for game in ("TowerOfHanoi-v0-medium", "FrozenLake-v0-random", "GuessTheNumber-v0-hardcore"):
        assert hasattr(TextArenaEnv(game=game), "oracle_action")


def test_a_task_id_is_textarenas_own_seed():
    for game in ("GuessTheNumber-v0", "Minesweeper-v0-small", "FrozenLake-v0-random", "Mastermind-v0"):
        env = TextArenaEnv(game=game)
        for t in (0, 1, 7):
            first, _, _, _ = textarena_play(game, t, [])
            assert env.reset(t, seed=99) == first.lstrip("\n")  # the task id wins over the row's seed
        assert env.reset(None, seed=5) == textarena_play(game, 5, [])[0].lstrip("\n")
    env = TextArenaEnv(game="GuessTheNumber-v0")
    secrets = []
    for t in range(40):
        env.reset(t)
        ref = ta.make("GuessTheNumber-v0")
        ref.reset(num_players=1, seed=t)
        secrets.append(env._bare.game_number)
        assert secrets[-1] == ref.game_number
    assert len(set(secrets)) >= 10  # the tasks are different games
    with pytest.raises(ValueError, match="task_id must be an int"):
        env.reset("3")


def test_conformance_kit_and_oracles():
    for game in ("GuessTheNumber-v0", "TowerOfHanoi-v0", "Blackjack-v0", "Minesweeper-v0-small", "Countdown-v0"):
        check_env(lambda: TextArenaEnv(game=game), task_ids=[0, 3, None], actions=["[5]", "[A C]", "[Hit]"])
    check_oracle(lambda: TextArenaEnv(game="GuessTheNumber-v0"), task_ids=list(range(40)), max_steps=5)
    check_oracle(lambda: TextArenaEnv(game="GuessTheNumber-v0-hardcore"), task_ids=list(range(20)), max_steps=6)
    check_oracle(lambda: TextArenaEnv(game="TowerOfHanoi-v0"), task_ids=[0], max_steps=7)
    check_oracle(lambda: TextArenaEnv(game="TowerOfHanoi-v0", config={"num_disks": 5, "max_turns": 31}),
                 task_ids=[0], max_steps=31)
    check_oracle(lambda: TextArenaEnv(game="FrozenLake-v0-random"), task_ids=list(range(20)), max_steps=30)


# ------------------------------------------------------------------- real rewards, against TextArena itself
GAMES = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Blackjack-v0", "Minesweeper-v0-small"]
EPISODES = 16


@pytest.mark.parametrize("game", GAMES)
def test_episodes_through_the_rollout_loop_are_textarenas_own(game, tokenizer, composer_and_template):
    """Sixteen episodes played at once through the rollout loop (react template, env calls on threads), scored by
    reward=textarena; then TextArena alone replays each episode's moves in order: every step's observation, invalid
    flag and end, and the final reward, must be TextArena's."""
    composer, template = composer_and_template
    tasks = [{"task_id": t, "seed": 1000 + t} for t in range(EPISODES)]
    trajs = play(game, template, tokenizer, tasks)
    breakdowns, _ = composer.compose_batch(trajs)
    rewards, invalid_turns, ended_invalid = [], 0, 0
    for traj, b in zip(trajs, breakdowns):
        actions = [t.action.content for t in traj.turns]
        first, steps, reward, game_info = textarena_play(game, traj.task_id, actions)
        where = f"{game} task {traj.task_id}, moves {actions}"
        assert traj.initial_observation == first.lstrip("\n"), where
        assert traj.termination == "done" and len(steps) == len(traj.turns), where
        for turn, (done, added, invalid) in zip(traj.turns, steps):
            assert turn.done == done and turn.info["invalid"] == invalid, where
            body = turn.observation
            if done and turn.info["reason"]:
                tail = f"[GAME] {turn.info['reason']}"
                assert body == tail or body.endswith("\n" + tail), where
                body = "" if body == tail else body[: -len(tail) - 1]
            # what TextArena added: its echo of the move (which ours leaves out: the reply holds it), then our body
            echo = added[: len(added) - len(body) - 1] if body else added
            assert added.endswith("\n" + body) if body else True, where
            assert re.match(r"\n\[(Player|GAME)\] ", echo) and "invalid move" not in echo, where
            assert turn.reward == (reward if done else 0.0), where
        last = traj.turns[-1].info
        assert last["score"] == reward == b.raw["goal"] == traj.env_reward, where
        assert last["reason"] == game_info[0]["reason"] and traj.success == (reward >= 1.0), where
        rewards.append(reward)
        invalid_turns += sum(t.info["invalid"] for t in traj.turns)
        ended_invalid += bool(game_info[0]["invalid_move"])
    print(f"\n{game}: {len(trajs)} episodes, rewards {sorted(rewards)}, {invalid_turns} invalid moves, "
          f"{ended_invalid} games lost to a second invalid move in a row")
    assert invalid_turns > 0 and len(set(rewards)) > 1  # illegal moves were played, and the games went differently
    if game in ("GuessTheNumber-v0", "TowerOfHanoi-v0"):
        assert 1.0 in rewards and any(0.0 < r < 1.0 for r in rewards)  # wins and partial credit, both TextArena's


def test_without_each_games_own_random_state_concurrent_games_would_not_be_textarenas(tokenizer, monkeypatch,
                                                                                         composer_and_template):
    """Why :class:`games.Isolated` exists: with every game on the global ``random`` (what TextArena does alone),
    sixteen Blackjack games dealt at once draw each other's cards, and the replays disagree."""
    _, template = composer_and_template
    monkeypatch.setattr(games.Isolated, "__call__", lambda self: contextlib.nullcontext())
    tasks = [{"task_id": t, "seed": 0} for t in range(EPISODES)]
    trajs = play("Blackjack-v0", template, tokenizer, tasks)
    differ = 0
    for traj in trajs:
        first, steps, reward, _ = textarena_play("Blackjack-v0", traj.task_id, [t.action.content for t in traj.turns])
        ours = [traj.initial_observation] + [t.observation for t in traj.turns]
        differ += ours[0] != first.lstrip("\n") or traj.turns[-1].reward != reward or len(steps) != len(traj.turns)
    assert differ > 0


# -------------------------------------------------------------------------------- illegal moves never crash
OFFLINE = ["GuessTheNumber-v0", "TowerOfHanoi-v0", "Minesweeper-v0-small", "Blackjack-v0", "FrozenLake-v0",
           "Mastermind-v0", "LightsOut-v0", "Countdown-v0", "Cryptarithm-v0", "2048-v0-ultra-easy", "Bandit-v0",
           "Secretary-v0", "ThreeCardMonte-v0", "PegJump-v0", "FifteenPuzzle-v0", "Slitherlink-v0", "Set-v0",
           "LogicPuzzle-v0", "Crosswords-v0", "Sudoku-v0-very-easy"]


@pytest.mark.parametrize("game", OFFLINE)
def test_an_illegal_move_is_an_invalid_action_with_textarenas_message(game):
    """A move the game cannot read is TextArena's invalid move: its own message, and one resubmission; a second in
    a row ends the game with TextArena's result. Hostile text is answered, never raised."""
    env = TextArenaEnv(game=game)
    env.reset(2)
    r = env.step("qqq zzz")
    assert r.info["invalid"] is True and not r.done and r.reward == 0.0
    assert r.observation.startswith("[GAME] You attempted an invalid move. Reason: ")
    r = env.step("zzz qqq")
    first, steps, reward, game_info = textarena_play(game, 2, ["[qqq zzz]", "[zzz qqq]"])
    assert r.done and r.info["invalid"] is True and steps[-1][0] and steps[-1][2]
    assert r.info["reason"] == str(game_info[0]["reason"]) and r.info["reason"].startswith("Invalid Move: ")
    assert r.info["success"] is False
    if isinstance(reward, (int, float)):
        assert r.reward == r.info["score"] == reward and "reward_error" not in r.info
    else:  # textarena 0.7.4 swaps reward and reason in some games' invalid moves: counted as 0, and said
        assert r.reward == 0.0 and r.info["reward_error"].startswith(f"TextArena gave {str(reward)[:200]!r}")
    assert env.step("[1]").info["invalid"] is True  # after the end: answered
    env.reset(3)
    for text in hostile_texts(40, seed=1):
        res = env.step(text)
        assert isinstance(res.observation, str) and isinstance(res.info["invalid"], bool)
        if res.done:
            env.reset(3)
    env.close()


def test_a_game_that_raises_on_a_move_ends_the_episode_as_invalid(monkeypatch):
    from textarena.envs.GuessTheNumber.env import GuessTheNumberEnv

    env = TextArenaEnv(game="GuessTheNumber-v0")
    env.reset(0)
    original = GuessTheNumberEnv.step
    monkeypatch.setattr(GuessTheNumberEnv, "step", lambda self, action: 1 / 0)
    r = env.step("[3]")
    assert r.done and r.reward == 0.0 and r.info["invalid"] and r.info["success"] is False
    assert r.info["game_error"] == "ZeroDivisionError: division by zero"
    assert "The game could not take this move (ZeroDivisionError" in r.observation
    monkeypatch.setattr(GuessTheNumberEnv, "step", original)
    env.reset(0)  # the env plays again after the failure
    for _ in range(5):
        r = env.step(env.oracle_action())
        if r.done:
            break
    assert r.done and r.info["success"] and r.reward == 1.0


# ------------------------------------------------------------------------------------- bad input, one line
@pytest.mark.parametrize("override, line", [
    ("env.kwargs.game=GuessTheNumbr-v0", r"^env\.kwargs\.game=GuessTheNumbr-v0: not a TextArena game id; did you "
                                         r"mean GuessTheNumber-v0"),
    ("env.kwargs.game=Pong-v9", r"^env\.kwargs\.game=Pong-v9: not a TextArena game id; TextArena has \d+ ids, e\.g\. "
                                r"the single-player GuessTheNumber-v0"),
    ("env.kwargs.game=TicTacToe-v0", r"^env\.kwargs\.game=TicTacToe-v0: a two-player game of TextArena; name the "
                                     r"opponent the model plays against: env\.kwargs\.opponent=random"),
    ("env.kwargs.game=ConnectFour-v0 env.kwargs.opponent=random",
     r"^env\.kwargs\.game=ConnectFour-v0: its messages list no moves .*, so opponent=random cannot play it; "
     r"two-player games that list them: TicTacToe-v0"),
    ("env.kwargs.opponent=random", r"^env\.kwargs\.opponent=random: GuessTheNumber-v0 is a single-player game"),
    ("env.kwargs.game=TicTacToe-v0 env.kwargs.opponent=minimax",
     r"^env\.kwargs\.opponent=minimax: not an opponent; choose random"),
    ("env.kwargs.game=TicTacToe-v0 env.kwargs.opponent=random env.kwargs.seat=2",
     r"^env\.kwargs\.seat=2: must be 0, 1 or null"),
    ("env.kwargs.game=SecretMafia-v0", r"^env\.kwargs\.game=SecretMafia-v0: a game for \d+ or more players"),
    ("env.kwargs.game=Wordle-v0", r"^env\.kwargs\.game=Wordle-v0: TextArena cannot start this game here "
                                  r"\(LookupError: Resource 'words' not found\. \(NLTK data this machine does not "
                                  r"have\)\); env=textarena plays games that need no download or API key"),
    ("env.kwargs.game=TwentyQuestions-v0", r"^env\.kwargs\.game=TwentyQuestions-v0: TextArena cannot start this game "
                                           r"here \(ValueError: OpenRouter API key not found"),
    ("env.kwargs.config.max_numbr=30", r"^env\.kwargs\.config\.max_numbr=30: not a setting of TextArena's "
                                       r"GuessTheNumber-v0 \(GuessTheNumberEnv\); did you mean max_number\?"),
    ("env.kwargs.config.max_number=0", r"^env\.kwargs\.config=\{\"max_number\": 0\}: TextArena's GuessTheNumber-v0 "
                                       r"does not start with these settings \(ValueError: empty range"),
    ("env.kwargs.success_threshold=high", r"^env\.kwargs\.success_threshold=high: must be a number"),
    ("env.kwargs.gme=Wordle-v0", r"^env\.kwargs\.gme=Wordle-v0: unknown key of the env 'textarena'; did you mean "
                                 r"env\.kwargs\.game\?"),
])
def test_bad_settings_are_one_line_before_anything_starts(override, line, capfd):
    with pytest.raises(ConfigError, match=line) as err:
        load(["env=textarena", *override.split()], training=False)
    assert "\n" not in str(err.value)
    out, errout = capfd.readouterr()
    assert "nltk" not in (out + errout).lower()  # the check tried the game silently


def test_a_game_with_settings_plays_with_them():
    env = TextArenaEnv(game="TowerOfHanoi-v0", config={"num_disks": 4, "max_turns": 30})
    assert "Tower of Hanoi with 4 disks" in env.reset(0)
    assert load(["env=textarena", "env.kwargs.game=TowerOfHanoi-v0", "env.kwargs.config.num_disks=4"],
                training=False).env.kwargs["config"] == {"num_disks": 4}


@pytest.mark.parametrize("command, override, says", [
    ("train", "env.kwargs.game=GuessTheNumbr-v0", "env.kwargs.game=GuessTheNumbr-v0: not a TextArena game id; "
                                                  "did you mean GuessTheNumber-v0"),
    ("rollout", "env.kwargs.game=Chopsticks-v0", "env.kwargs.game=Chopsticks-v0: a two-player game of TextArena"),
])
def test_a_bad_game_stops_the_command_with_exit_2_in_one_line_before_a_run_folder(command, override, says, tmp_path,
                                                                                    command_here):
    folder = {"train": f"trainer.run_dir={tmp_path / 'out'}", "rollout": f"rollout.output_dir={tmp_path / 'out'}"}
    proc = command_here([command, "env=textarena", override, folder[command]])  # the console script's main, here
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and says in lines[0], proc.stderr
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------ trained from the command line
SMALL = ["trainer.progress=false", "trainer.loggers=[]", "trainer.num_cpus=1", "trainer.num_workers=1",
         "model.tiny.hidden_size=32", "model.tiny.num_layers=1", "model.tiny.num_heads=2", "model.tiny.num_kv_heads=1",
         "model.tiny.intermediate_size=64", "model.tiny.vocab_size=400", "data.train_batch_size=2", "algorithm.n=2",
         "env.train_tasks=32", "env.val_tasks=4", "model.corpus_tasks=8", "warmup.steps=80", "warmup.num_demos=32",
         "warmup.validate=false", "rollout.max_new_tokens=16", "trainer.save_at_end=false"]


@pytest.mark.slow
def test_guess_the_number_trains_three_steps_from_the_command_line_on_textarenas_reward(tmp_path, ray_local,
                                                                                      command_here):
    """3 GRPO steps of the tiny model (after the oracle's warm-up) on GuessTheNumber with 4 guesses; every
    validation episode's goal reward is TextArena's own result for that episode's moves. The command runs in this
    process (the console script's main) on the module's local Ray."""
    run = tmp_path / "run"
    proc = command_here(["train", "env=textarena", "reward=textarena", "env.kwargs.game=GuessTheNumber-v0",
                         "env.kwargs.config.max_turns=4", "env.max_turns=8", "trainer.total_steps=3", *SMALL,
                         f"trainer.run_dir={run}"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "warm-up skipped" not in proc.stdout  # the binary-search oracle gave the warm-up its demonstrations
    rows = {r["step"]: r for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    assert {1, 2, 3} <= set(rows)
    for step in (1, 2, 3):
        assert rows[step]["rollout/termination/env_error"] == 0
    episodes = [json.loads(x) for x in (run / "validation" / "val_step_000003.jsonl").read_text().splitlines()]
    assert len(episodes) == 4
    for ep in episodes:
        actions = [t["action"]["content"] for t in ep["turns"]]
        _, steps, reward, _ = textarena_play("GuessTheNumber-v0", ep["task_id"], actions, {"max_turns": 4})
        assert [t["info"]["invalid"] for t in ep["turns"]] == [s[2] for s in steps[: len(ep["turns"])]]
        expected = reward if ep["termination"] == "done" else 0.0  # cut short by env.max_turns: no TextArena result
        assert ep["reward_parts"]["goal"] == expected, (ep["termination"], actions)
    goals = [ep["reward_parts"]["goal"] for ep in episodes]
    print(f"\nvalidation at step 3: goal rewards {goals}")
    assert any(g > 0 for g in goals)  # after the warm-up the model plays: TextArena's partial credit, not only 0


def test_a_task_is_the_same_game_in_every_process():
    """Games dealt and played in two processes with different string hashing (a game that iterated a set of words
    would differ): the same observations and rewards for the same task ids and moves."""
    code = ("import json\n"
            "from openmanus_rl_env_textarena import TextArenaEnv\n"
            "out = []\n"
            "for game in ('Minesweeper-v0-small', 'Blackjack-v0', 'LogicPuzzle-v0', 'Crosswords-v0', 'Set-v0'):\n"
            "    env = TextArenaEnv(game=game)\n"
            "    for t in (0, 1):\n"
            "        out.append(env.reset(t))\n"
            "        for move in ('[1 1]', '[Hit]', '[park]', '[0 0 A]', '[1, 2, 3]', '[Stand]'):\n"
            "            r = env.step(move)\n"
            "            out.append([r.observation, r.reward, r.done])\n"
            "print(json.dumps(out))")
    outs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=300,
                           env={**os.environ, "PYTHONHASHSEED": str(h)}).stdout for h in (1, 2)]
    assert outs[0] == outs[1] and len(json.loads(outs[0].splitlines()[-1])) > 20  # (a game may print before it)
