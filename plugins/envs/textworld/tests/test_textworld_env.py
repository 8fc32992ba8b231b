"""The TextWorld env: games made by tw-make into a tmp cache, oracle wins, per-step rewards, hostile text.

Two small games are generated once for the module (about 3-7 s each on a 2-core CPU; the two run in
parallel), with two parallel quests so that ``max_score == 2`` and the score rises at two different steps:
that is what tells a per-step reward apart from TextWorld's cumulative score.
"""

from __future__ import annotations

import string
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from openmanus_rl_core.testing import check_env, check_oracle
from openmanus_rl_env_textworld import GameCache, TextWorldEnv, clean_action, clean_observation
from openmanus_rl_env_textworld.games import default_games_dir, make_args_to_cli, settings_hash

# Jericho warns at every load that it cannot score TextWorld games itself (TextWorld does).
pytestmark = pytest.mark.filterwarnings("ignore:Game .* is not fully supported")

MAKE_ARGS = {"world_size": 2, "nb_objects": 3, "quest_length": 2, "nb_parallel_quests": 2}
TASKS = (0, 1)


class CountingCache(GameCache):
    """Counts real tw-make runs, to show that concurrent requests for one game generate it once."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.generated: list[int] = []
        self._count_lock = threading.Lock()

    def _generate(self, seed: int) -> None:
        with self._count_lock:
            self.generated.append(seed)
        super()._generate(seed)


@pytest.fixture(scope="module")
def games_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tw_games")
    cache = CountingCache(folder, "custom", MAKE_ARGS)
    start = time.perf_counter()
    # Three workers, two of them racing for game 0: the lock must make it once, the rename keep it whole.
    paths = cache.pregenerate([0, 0, 1], workers=3)
    took = time.perf_counter() - start
    print(f"\ngenerated {len(set(paths))} TextWorld games in {took:.1f} s")
    assert sorted(cache.generated) == [0, 1], cache.generated
    return folder


def make_env(games_dir: Path, **kw) -> TextWorldEnv:
    return TextWorldEnv(games_dir=games_dir, make_args=MAKE_ARGS, **kw)


def play_oracle(env: TextWorldEnv, task_id: int, max_steps: int = 30):
    env.reset(task_id=task_id)
    results = []
    for _ in range(max_steps):
        results.append(env.step(env.oracle_action()))
        if results[-1].done:
            break
    return results


# ------------------------------------------------------------------------------------------ cache
def test_games_are_cached_whole_and_nothing_is_left_behind(games_dir):
    for t in TASKS:
        assert (games_dir / f"game_{t}.z8").is_file() and (games_dir / f"game_{t}.json").is_file()
    assert not [p for p in games_dir.iterdir() if p.name.startswith(".tmp_")]
    cache = GameCache(games_dir, "custom", MAKE_ARGS)
    before = (games_dir / "game_0.z8").stat().st_mtime_ns
    assert cache.get(0) == games_dir / "game_0.z8"  # cached: no second generation
    assert (games_dir / "game_0.z8").stat().st_mtime_ns == before


def test_settings_pick_the_cache_folder_and_map_to_tw_make_flags():
    assert settings_hash("custom", {"world_size": 2}) != settings_hash("custom", {"world_size": 3})
    assert default_games_dir("custom", {"world_size": 2}).parts[-3:-1] == ("openmanus_rl", "textworld")
    assert make_args_to_cli({"world_size": 2, "include_adj": True, "theme": None, "x": False}) == [
        "--world-size", "2", "--include-adj"]
    with pytest.raises(ValueError, match="seed"):
        GameCache(None, "custom", {"seed": 3})


def test_bad_settings_fail_with_tw_makes_message(tmp_path):
    env = TextWorldEnv(games_dir=tmp_path, challenge="no-such-challenge")
    with pytest.raises(RuntimeError, match="tw-make failed"):
        env.reset(task_id=0)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp_")]


# ----------------------------------------------------------------------------------- the contract
@pytest.mark.parametrize("task_id", TASKS)
def test_oracle_wins_and_rewards_sum_to_max_score(games_dir, task_id):
    env = make_env(games_dir)
    try:
        results = play_oracle(env, task_id)
        last = results[-1]
        assert last.done and last.info["success"] is True and last.info["won"] is True
        assert last.info["max_score"] == 2
        assert sum(r.reward for r in results) == pytest.approx(last.info["max_score"])
    finally:
        env.close()


@pytest.mark.parametrize("task_id", TASKS)
def test_reward_is_the_score_delta_not_the_score(games_dir, task_id):
    env = make_env(games_dir)
    try:
        results = play_oracle(env, task_id)
        prev = 0.0
        for r in results:
            assert r.reward == pytest.approx(r.info["score"] - prev)
            prev = r.info["score"]
        rewards = [r.reward for r in results]
        scores = [r.info["score"] for r in results]
        assert rewards != scores  # the score stays at 1 between the two quests; the reward drops back to 0
        assert max(rewards) == 1.0 and scores[-1] == 2.0
    finally:
        env.close()


def test_admissible_commands_shown_only_when_asked(games_dir):
    plain, shown = make_env(games_dir), make_env(games_dir, show_admissible=True)
    try:
        obs_plain, obs_shown = plain.reset(task_id=0), shown.reset(task_id=0)
        assert "Admissible commands:" not in obs_plain
        assert obs_shown.startswith(obs_plain) and "Admissible commands:" in obs_shown
        step = shown.step("look")
        listed = step.observation.rsplit("Admissible commands: ", 1)[1].split(", ")
        assert listed == step.info["admissible_commands"] and "look" in listed
        assert "Admissible commands:" not in plain.step("look").observation
        assert plain.step("look").info["admissible_commands"]  # always in info
    finally:
        plain.close()
        shown.close()


def test_reset_is_deterministic_and_restarts_the_game(games_dir):
    a, b = make_env(games_dir), make_env(games_dir)
    try:
        first = a.reset(task_id=1, seed=3)
        assert first == b.reset(task_id=1, seed=99)  # a game is fixed by its task id
        assert "$$$$" not in first and not first.endswith(">")  # banner and prompt are gone
        a.step(a.oracle_action())
        assert a.reset(task_id=1, seed=3) == first
        assert a.reset(task_id=0) != first
        assert a.reset(task_id=None, seed=1) == first  # task_id None plays task `seed`
    finally:
        a.close()
        b.close()


def test_conformance_kit(games_dir):
    check_env(lambda: make_env(games_dir), task_ids=list(TASKS), actions=["look", "inventory", "go north", "take"])
    check_env(lambda: make_env(games_dir, show_admissible=True), task_ids=[0], hostile=5)
    check_oracle(lambda: make_env(games_dir), task_ids=list(TASKS))


def test_instruction_and_registry(games_dir):
    from openmanus_rl_core.plugin.registry import registry

    env = registry("env").build("textworld", games_dir=str(games_dir), make_args=MAKE_ARGS)
    try:
        assert isinstance(env, TextWorldEnv) and "command" in env.instruction
        assert env.num_tasks is None  # generated games: unbounded ids
        assert env.reset(task_id=0)
    finally:
        env.close()


def test_config_is_contributed():
    import yaml

    from openmanus_rl_env_textworld import hooks

    (folder,) = hooks.openmanus_rl_config_dirs()
    cfg = yaml.safe_load((Path(folder) / "env" / "textworld.yaml").read_text())
    assert cfg["name"] == "textworld"
    assert {"max_turns", "train_tasks", "val_tasks", "kwargs"} <= set(cfg)
    TextWorldEnv(**cfg["kwargs"]).close()  # the shipped kwargs are accepted (and build nothing yet)


# ------------------------------------------------------------------------------------ game files
def test_existing_game_files(games_dir, tmp_path):
    files = sorted(str(p) for p in games_dir.glob("*.z8"))
    for spec in (files, str(games_dir), str(games_dir / "game_*.z8")):
        env = TextWorldEnv(game_files=spec)
        try:
            assert env.num_tasks == 2
            assert env.reset(task_id=3) == env.reset(task_id=1)  # ids wrap over the files
            assert env.game_file(0).name == "game_0.z8"
        finally:
            env.close()
    lonely = tmp_path / "lonely.z8"
    lonely.write_bytes((games_dir / "game_0.z8").read_bytes())
    with pytest.raises(ValueError, match="lonely.json"):
        TextWorldEnv(game_files=[str(lonely)])
    with pytest.raises(ValueError, match="matched no game"):
        TextWorldEnv(game_files=str(tmp_path / "none_*.z8"))


# ------------------------------------------------------------------------------------ hostile text
@pytest.mark.parametrize("text", ["\x00", "a\x00b", "go south\nlook", "look\r\nlook", "x" * 5000, "ünïcödé 🙂",
                                  "\ud800", "", "   ", "\x1b[31m", "\\q", "\\help", "go \\n"])
def test_step_refuses_what_would_hang_crash_or_desync_the_interpreter(games_dir, text):
    # "\x00" and "\\q" hang Jericho's frotz and "a\x00b" segfaults it; a newline would send two game inputs.
    env = make_env(games_dir)
    try:
        env.reset(task_id=0)
        r = env.step(text)
        assert isinstance(r.observation, str) and r.observation and r.reward == 0.0 and not r.done
        assert r.info["invalid"] is True
    finally:
        env.close()


@pytest.mark.parametrize("text", ["restart", "RESTORE", "quit", "q", "look restart", "save", "undo",
                                  "tw-trace-actions", "script", "look. go north", "look, go north",
                                  "look then go north"])
def test_meta_and_chained_commands_are_refused_so_the_score_stays_in_step(games_dir, text):
    # restart/restore reset the game behind TextWorld's tracker; "a. b" runs b where the tracker misses it.
    env = make_env(games_dir)
    try:
        env.reset(task_id=0)
        first = env.step(env.oracle_action())
        r = env.step(text)
        assert ("not available" in r.observation or "one command" in r.observation) and r.info["invalid"]
        assert not r.done
        env.step("yes")  # would confirm a restart/quit prompt, had one been shown
        rest = [first]
        while not rest[-1].done:
            rest.append(env.step(env.oracle_action()))
        assert rest[-1].info["won"] and sum(x.reward for x in rest) == 2.0
    finally:
        env.close()


def test_step_outside_an_episode_does_not_raise(games_dir):
    env = make_env(games_dir)
    try:
        r = env.step("look")
        assert r.done and r.info["invalid"]
        play_oracle(env, 0)
        after = env.step("look")
        assert after.done and after.reward == 0.0 and after.info["success"]
    finally:
        env.close()
        env.close()


def test_parser_failures_are_flagged_invalid(games_dir):
    env = make_env(games_dir)
    try:
        env.reset(task_id=0)
        assert env.step("xyzzy frobnicate").info["invalid"] is True
        assert env.step("look").info["invalid"] is False
    finally:
        env.close()


def test_clean_helpers():
    assert clean_action("  go \t north\n", 200) == ("go north", None)
    assert clean_action("go\u00a0north", 200) == ("go north", None)
    assert clean_action("restart", 200)[1] and clean_action("x" * 201, 200)[1]
    assert clean_action("take restarter", 200) == ("take restarter", None)  # whole words only
    assert clean_action("go south.", 200) == ("go south", None)
    for chained in ("look. go south", "look, go south", "look then go south"):
        assert "one command at a time" in clean_action(chained, 200)[1]
    assert clean_observation("\n\nHi.\n\n\n\n>   -= Room =-0/1", None) == "Hi."


_hostile = st.one_of(
    st.text(alphabet=string.printable, max_size=300),
    st.text(alphabet=st.characters(blacklist_categories=()), max_size=300),  # surrogates and controls too
    st.sampled_from(["look", "inventory", "go south", "go north", "take", "open", "restart", "yes", "\x00", "a\x00b",
                     "\\q", "look. go north", "look then go south", "again", "oops box", "take all"]),
)


@pytest.fixture(scope="module")
def shared_env(games_dir):
    env = make_env(games_dir, show_admissible=True)
    yield env
    env.close()


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(texts=st.lists(_hostile, min_size=1, max_size=6))
def test_arbitrary_text_never_raises_and_the_game_stays_winnable(shared_env, texts):
    env = shared_env
    env.reset(task_id=1)
    total, done = 0.0, False
    for text in texts:
        r = env.step(text)
        assert "Admissible commands:" in r.observation or r.done
        assert isinstance(r.observation, str) and isinstance(r.reward, float) and isinstance(r.done, bool)
        total += r.reward
        done = r.done
        if done:
            break
    # Whatever the text did, TextWorld's tracking still matches the game: the oracle finishes it and
    # the rewards still add up to the score.
    for _ in range(30):
        if done:
            break
        r = env.step(env.oracle_action())
        total += r.reward
        done = r.done
    if r.info["won"]:
        assert total == pytest.approx(r.info["max_score"])
    else:
        assert r.info["lost"]


def test_envs_play_concurrently_in_threads(games_dir):
    outcomes: dict[int, tuple[bool, float]] = {}

    def play(i: int) -> None:
        env = make_env(games_dir)
        try:
            results = play_oracle(env, i % 2)
            outcomes[i] = (results[-1].info["success"], sum(r.reward for r in results))
        finally:
            env.close()

    threads = [threading.Thread(target=play, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert outcomes == {i: (True, 2.0) for i in range(4)}
