"""How far self-play gets on a budget of games when the policy is a table (issue 54): no model and no text, each
state's action probabilities its own parameters. It sizes the goals that bench/selfplay.py (Leduc Poker) and
bench/tictactoe.py measure a model against.

    python bench/tabular_selfplay.py                                   # both games, both learners, seeds 0-2
    python bench/tabular_selfplay.py --game leduc_poker --steps 480 --games-per-step 128 --seeds 0

A step plays ``--games-per-step`` games with the policy in every seat, then updates each state the games visited
(one softmax over its legal actions, its logits moved by ``lr`` times the mean over the step's games of each
visit's gradient). The tables of values are running means over a state's (or a state and action's) last 20 visits,
from earlier steps only, as ``algorithm.adv_estimator=value_table`` keeps them. Learners:

- ``pg``: the sampled policy gradient against the state's value: at each visit ``A = G - V(s)``, gradient
  ``A * (onehot(a) - pi)``. This is what a self-play run of bench/selfplay.py's ``table`` row does, without the model.
- ``qpg``: every legal action moved by its own value, the policy gradient's expectation (all-action policy
  gradient): at each visit the gradient on action ``b`` is ``pi(b) * (Q(s, b) - sum_c pi(c) Q(s, c))``, ``Q`` the
  mean return after taking ``b`` at ``s`` (where never taken, the mean of the actions' that were; the state's value
  where none was). In tic-tac-toe ``Q(s, b)`` is the value of the board the move leaves, which other orders of the
  same moves share.
- ``pg+all``: ``pg`` plus 0.3 times each legal action's logit moved by ``Q(s, b) - mean_c Q(s, c)`` (no ``pi(b)``
  factor, so a dropped action comes back once its value is the better one). This is the update of a run with
  ``algorithm.adv_estimator=value_table algorithm.all_action_coeff=0.3`` (docs/selfplay.md).

Every learner's logits are kept within +-20.

States are Leduc's information states (936) and tic-tac-toe's boards (5,478; the run's observation holds the moves'
order, so a table keyed on it, as the value table is, sees more states). Scores: Leduc, OpenSpiel's exploitability
of the last policy and of the mean of every step's policy (uniform play 2.374); tic-tac-toe, the greedy policy's
non-loss over 200 games (100 a seat) against OpenSpiel's MCTS bot with 100 simulations and against uniform random
play, as ``bench/tictactoe.py`` scores a run. The learning rates were picked on seed 0 from a few (pg 1-64, the
others 0.3-4 on Leduc; 1-8 on tic-tac-toe). The default budgets are what the model's runs play: Leduc 32 games a step for 480 steps (bench/selfplay.py's
entry plays about that many in 20 minutes here), tic-tac-toe 32 a step for 240 steps (the preset), then four times
as many steps.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

LEARNING_RATES = {("leduc_poker", "pg"): 4.0, ("leduc_poker", "qpg"): 1.0, ("leduc_poker", "pg+all"): 1.0,
                  ("tic_tac_toe", "pg"): 4.0, ("tic_tac_toe", "qpg"): 8.0, ("tic_tac_toe", "pg+all"): 4.0}
ALL_ACTION_COEFF = 0.3  # pg+all: the weight of the all-action term beside the sampled one
WINDOW = 20  # visits a value is the running mean over


class Learner:
    """One softmax policy per state over the game's actions, and the value tables its update reads."""

    def __init__(self, game, kind: str, lr: float, seed: int):
        self.game, self.kind, self.lr = game, kind, lr
        self.rng = np.random.default_rng(seed)
        self.num_actions = game.num_distinct_actions()
        self.logits: dict[str, np.ndarray] = {}
        self.values: dict[str, list[float]] = {}  # state -> [mean return, visits]
        self.action_values: dict[object, list[float]] = {}  # (state, action) or the board a move leaves -> same
        self.perfect_information = game.get_type().information == game.get_type().information.PERFECT_INFORMATION

    def key(self, state) -> str:
        return str(state) if self.perfect_information else state.information_state_string()

    def policy(self, state) -> tuple[str, list[int], np.ndarray]:
        key, legal = self.key(state), state.legal_actions()
        return key, legal, _softmax(self.logits.setdefault(key, np.zeros(self.num_actions))[legal])

    def action_key(self, state, key: str, action: int) -> object:
        return str(state.child(action)) if self.perfect_information else (key, action)

    def play(self) -> list[tuple]:
        """One self-play game: ``(state key, legal actions, action index, return, action keys)`` per move."""
        state, moves = self.game.new_initial_state(), []
        while not state.is_terminal():
            if state.is_chance_node():
                outcomes, probs = zip(*state.chance_outcomes())
                state.apply_action(outcomes[self.rng.choice(len(outcomes), p=probs)])
                continue
            key, legal, p = self.policy(state)
            i = int(self.rng.choice(len(legal), p=p))
            moves.append((key, legal, i, state.current_player(), [self.action_key(state, key, a) for a in legal]))
            state.apply_action(legal[i])
        returns = state.returns()
        return [(key, legal, i, returns[player], keys) for key, legal, i, player, keys in moves]

    def step(self, games: int) -> None:
        visits = [move for _ in range(games) for move in self.play()]
        grads: dict[str, np.ndarray] = {}
        for key, legal, i, ret, keys in visits:
            p = _softmax(self.logits[key][legal])
            value = self.values.get(key, [0.0])[0]
            g = np.zeros(len(legal))
            if self.kind != "qpg":
                g -= (ret - value) * p
                g[i] += ret - value
            found = [self.action_values.get(k) for k in keys]
            known = [entry[0] for entry in found if entry]
            unknown = sum(known) / len(known) if known else value  # as the value table fills a token never taken
            q = np.array([entry[0] if entry else unknown for entry in found])
            if self.kind == "qpg":
                g += p * (q - p @ q)
            if self.kind == "pg+all":
                g += ALL_ACTION_COEFF * (q - q.mean())
            grads.setdefault(key, np.zeros(self.num_actions))[legal] += g
        for key, legal, i, ret, keys in visits:  # this step's returns reach the tables after its update
            _visit(self.values, key, ret)
            _visit(self.action_values, keys[i], ret)
        for key, g in grads.items():
            self.logits[key] = np.clip(self.logits[key] + self.lr * g / games, -20.0, 20.0)

    def table(self):
        """The policy at every information state, as OpenSpiel's ``TabularPolicy``."""
        from open_spiel.python import policy as os_policy

        tab = os_policy.TabularPolicy(self.game)
        for key, row in tab.state_lookup.items():
            legal = np.nonzero(tab.legal_actions_mask[row])[0]
            tab.action_probability_array[row] = 0.0
            tab.action_probability_array[row, legal] = _softmax(self.logits.get(key, np.zeros(self.num_actions))[legal])
        return tab


def _softmax(logits: np.ndarray) -> np.ndarray:
    p = np.exp(logits - logits.max())
    return p / p.sum()


def _visit(table: dict, key: object, ret: float) -> None:
    entry = table.setdefault(key, [0.0, 0])
    entry[1] += 1
    entry[0] += (ret - entry[0]) / min(entry[1], WINDOW)


def non_loss(learner: Learner, opponent: str, games: int = 200, seed: int = 0) -> float:
    """The greedy policy's share of games not lost, half in each seat, against ``mcts`` (100 simulations) or
    ``random``."""
    import pyspiel

    rng = np.random.default_rng(seed)
    bot = None
    if opponent == "mcts":
        bot = pyspiel.MCTSBot(learner.game, pyspiel.RandomRolloutEvaluator(1, seed), 2.0, 100, 1000, False, seed,
                              False)
    kept = 0
    for g in range(games):
        seat, state = g % 2, learner.game.new_initial_state()
        while not state.is_terminal():
            if state.current_player() == seat:
                _, legal, p = learner.policy(state)
                action = legal[int(np.argmax(p))]
            elif bot is not None:
                action = bot.step(state)
            else:
                action = int(rng.choice(state.legal_actions()))
            state.apply_action(action)
        kept += state.returns()[seat] >= 0
    return kept / games


def run(game_name: str, kind: str, seed: int, steps: int, games: int, checkpoints: list[int]) -> dict[int, dict]:
    import pyspiel
    from open_spiel.python.algorithms import exploitability

    game = pyspiel.load_game(game_name)
    learner = Learner(game, kind, LEARNING_RATES[game_name, kind], seed)
    scores, mean = {}, None
    for t in range(1, steps + 1):
        learner.step(games)
        if game_name == "leduc_poker":  # the mean of every step's policy, by state
            tab = learner.table()
            mean = tab.action_probability_array.copy() if mean is None else mean + tab.action_probability_array
        if t in checkpoints:
            if game_name == "leduc_poker":
                last = exploitability.exploitability(game, tab)
                tab.action_probability_array[:] = mean / t
                scores[t] = {"last": last, "mean": exploitability.exploitability(game, tab)}
            else:
                scores[t] = {"mcts": non_loss(learner, "mcts", seed=seed), "random": non_loss(learner, "random",
                                                                                              seed=seed)}
    return scores


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", choices=["leduc_poker", "tic_tac_toe"], action="append")
    parser.add_argument("--learner", choices=["pg", "qpg", "pg+all"], action="append")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--steps", type=int, help="default: Leduc 480; tic-tac-toe 960, scored at 240 too")
    parser.add_argument("--games-per-step", type=int, default=32)
    a = parser.parse_args()
    seeds = [int(s) for s in a.seeds.split(",")]
    for game in a.game or ["leduc_poker", "tic_tac_toe"]:
        steps = a.steps or (480 if game == "leduc_poker" else 960)
        checkpoints = sorted({steps // 4, steps // 2, steps} if game == "leduc_poker" else {steps // 4, steps})
        cols = ["last", "mean"] if game == "leduc_poker" else ["mcts", "random"]
        print(f"\n{game}: {a.games_per_step} self-play games a step; "
              + ("exploitability of the last policy / the mean of every step's" if game == "leduc_poker"
                 else "greedy non-loss against MCTS (100 simulations) / random, 200 games"))
        print(f"| learner | lr | seed | {' | '.join(f'step {c} ({c * a.games_per_step:,} games)' for c in checkpoints)}"
              " | seconds |")
        print(f"|---|---|---|{'---|' * len(checkpoints)}---|")
        for kind in a.learner or ["pg", "qpg", "pg+all"]:
            finals = []
            for seed in seeds:
                t0 = time.perf_counter()
                scores = run(game, kind, seed, steps, a.games_per_step, checkpoints)
                cells = [" / ".join(f"{scores[c][k]:.3f}" for k in cols) for c in checkpoints]
                finals.append(scores[checkpoints[-1]][cols[0]])
                print(f"| {kind} | {LEARNING_RATES[game, kind]:g} | {seed} | {' | '.join(cells)} | "
                      f"{time.perf_counter() - t0:.0f} |", flush=True)
            if len(finals) > 1:
                print(f"| {kind} | | range | {' | '.join([''] * (len(checkpoints) - 1))} | "
                      f"{cols[0]} {min(finals):.3f}-{max(finals):.3f} (median {statistics.median(finals):.3f}) | |",
                      flush=True)


if __name__ == "__main__":
    main()
