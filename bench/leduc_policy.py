"""What a Leduc Poker policy learned: its probability of each action, averaged over the information states that show
the same cards and the same choice (issue 54).

    openmanus-rl export trainer.checkpoint=<run dir or checkpoints/step_N> export.dir=<dir>
    python bench/leduc_policy.py <dir>
    python bench/leduc_policy.py --values <dir>  # and what each action is worth to it, against itself
    python bench/leduc_policy.py --reference     # hand-written policies' exploitability, for scale
    python bench/leduc_policy.py --sampling      # a tabular sampling learner's, by the games it has played

``<dir>`` is a Hugging Face folder written by ``openmanus-rl export`` (its ``omrl_export.json`` names the
checkpoint; the run's ``config.json`` beside ``checkpoints/`` gives the game, the template and the env's
instruction). The policy is the one ``val/exploitability`` measures (``exploitability.ModelPolicy``: the model's
probability of each legal action's reply, normalised over the legal actions), scored at every one of the 936
information states. States are grouped by the cards the seat sees (``games.CARDS_IN_WORDS``: its own card and, in
the second round, the public one, ``pair`` where the ranks match) and by the legal actions (``Fold`` is legal when
facing a bet, ``Raise`` until the round's raises are used up); each group's line is the mean probability of each
action's text over its states. The last line is OpenSpiel's exploitability of the whole policy, as the run's
validation logs it.

``--values`` adds what each action is worth in self-play: OpenSpiel's action values (``action_value``, a walk of
the whole game tree with the policy in both seats) give the seat's expected chips after taking the action at the
state and playing the policy from then on, against the policy. A group's value of an action is their mean over its
states weighted by how often the policy reaches each (states it never reaches count for nothing), and a group's
``reach`` is that weight: the chance that a game passes through one of its states, summed over them. Where an
action the policy never takes is worth more than the ones it does, the policy gradient of a sampled action cannot
find it (an action's expected gradient is its probability times its advantage); where it is worth less, the policy
is right against itself and only exploitable by a stronger opponent.
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

ACTIONS = ("Fold", "Call", "Raise")  # Leduc's action texts, OpenSpiel's actions 0, 1 and 2


def _run_config(folder: Path) -> dict:
    checkpoint = Path(json.loads((folder / "omrl_export.json").read_text())["checkpoint"])
    return json.loads((checkpoint.parent.parent / "config.json").read_text())


def _cards(state, player: int) -> list[str]:
    """The ranks the seat sees, in words: its own, then the public card's once dealt (``games.CARDS_IN_WORDS``)."""
    from openmanus_rl_env_openspiel import games

    return [line.split(": ", 1)[1] for line in games.CARDS_IN_WORDS["leduc_poker"](state, player)
            if line.startswith(("Your card:", "Public card:"))]


def _group(state, player: int) -> str:
    from openmanus_rl_env_openspiel import games

    cards = _cards(state, player)
    if len(cards) == 2:
        cards[1] = "pair" if cards[0] == cards[1] else f"public {cards[1]}"
    return f"{', '.join(cards)}; {' / '.join(games.legal_texts(state, player))}"


def _rule(fold: float, raise_: float):
    """A hand-strength rule as a table over every information state: with a pair, or a king in the first round,
    raise with probability ``raise_`` (else call); with a weak hand (a jack in the first round, no pair and no king
    in the second) fold to a raise with probability ``fold`` (else call); otherwise call."""
    def probs(state, player: int) -> dict[int, float]:
        own, *public = _cards(state, player)
        strong = public == [own] or (not public and own == "King")
        weak = not strong and (own == "Jack" or (bool(public) and own != "King"))
        legal = state.legal_actions(player)  # 0 fold, 1 call, 2 raise
        want = ({2: raise_, 1: 1 - raise_} if strong else
                {0: fold, 1: 1 - fold} if weak and 0 in legal else {1: 1.0})
        kept = {a: want.get(a, 0.0) for a in legal}
        total = sum(kept.values())
        return {a: p / total for a, p in kept.items()} if total else {1: 1.0}  # no raise left: call
    return probs


def reference() -> None:
    """OpenSpiel's exploitability of uniform play, of always calling and of hand-strength rules, for scale."""
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability

    from openmanus_rl_env_openspiel import games
    from openmanus_rl_env_openspiel.exploitability import information_states

    spiel = games.check_game("leduc_poker")
    rules = {"uniform": None, "always call": lambda state, player: {1: 1.0}}
    for fold in (0.0, 0.5, 0.8, 1.0):
        for raise_ in (0.5, 0.8, 1.0):
            rules[f"rule: fold a weak hand {fold:.0%}, raise a strong one {raise_:.0%}"] = _rule(fold, raise_)
    print("| policy | exploitability |\n|---|---|")
    for name, probs in rules.items():
        table = os_policy.UniformRandomPolicy(spiel) if probs is None else os_policy.TabularPolicy(spiel)
        if probs is not None:
            for (player, key), state in information_states(spiel).items():
                row = table.policy_for_key(key)
                row[:] = 0.0
                for action, p in probs(state, player).items():
                    row[action] = p
        print(f"| {name} | {exploitability.exploitability(spiel, table):.3f} |")


SAMPLED_GAMES = (1_000, 2_000, 5_000, 10_000, 20_000, 100_000)


def sampling(seeds=(0, 1, 2)) -> None:
    """How far a tabular learner gets on a budget of games, to size a self-play run's: OpenSpiel's outcome-sampling
    MCCFR (``pyspiel.OutcomeSamplingMCCFRSolver``: each iteration samples one game and updates the regrets of one
    seat, the seats in turn), the exploitability of its average policy after each number of games. A self-play step
    here trains both seats of each game, so its games count twice against these."""
    import pyspiel

    spiel = pyspiel.load_game("leduc_poker")
    print("| seed | " + " | ".join(f"{n:,} games" for n in SAMPLED_GAMES) + " |")
    print("|---" * (len(SAMPLED_GAMES) + 1) + "|")
    for seed in seeds:
        solver, played, row = pyspiel.OutcomeSamplingMCCFRSolver(spiel, seed=seed), 0, []
        for games in SAMPLED_GAMES:
            for _ in range(games - played):
                solver.run_iteration()
            played = games
            row.append(f"{pyspiel.exploitability(spiel, solver.average_policy()):.3f}")
        print(f"| {seed} | " + " | ".join(row) + " |")


def self_play_values(spiel, policy) -> dict[tuple[int, str], tuple[float, dict[int, float]]]:
    """Each information state's reach (the chance a self-play game passes through it) and the seat's expected
    chips after each legal action there, with ``policy`` (OpenSpiel's) in both seats."""
    from open_spiel.python.algorithms import action_value

    calculator = action_value.TreeWalkCalculator(spiel)
    calculator.compute_all_states_action_values([policy] * spiel.num_players())
    out = {}
    for key, reach in calculator.info_state_prob.items():
        values = calculator.weighted_action_values[key]
        if reach > 0:
            out[key] = (reach, {a: v[key[0]] / reach for a, v in values.items()})
    return out


def main(argv: list[str]) -> int:
    if argv == ["--reference"]:
        reference()
        return 0
    if argv == ["--sampling"]:
        sampling()
        return 0
    with_values = argv[:1] == ["--values"]
    argv = argv[1:] if with_values else argv
    if len(argv) != 1:
        raise SystemExit(__doc__.split("\n\n")[1])
    import torch
    from open_spiel.python.algorithms import exploitability
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from openmanus_rl_core.plugin.registry import build
    from openmanus_rl_env_openspiel import games
    from openmanus_rl_env_openspiel.env import OpenSpielEnv
    from openmanus_rl_env_openspiel.exploitability import ModelPolicy, information_states, model_score

    folder = Path(argv[0])
    cfg = _run_config(folder)
    env = OpenSpielEnv(**cfg["env"]["kwargs"])
    game = env.game_string
    if game != "leduc_poker":
        raise SystemExit(f"env.kwargs.game={game!r} in {folder}'s run: this summary reads leduc_poker's cards")
    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    template = build("template", cfg["template"])
    spiel = games.check_game(game)
    with torch.no_grad():
        policy = ModelPolicy(spiel, game, tokenizer, template, env.instruction,
                             model_score(model, tokenizer.pad_token_id or 0)).build()
    table = policy.as_openspiel()
    values = self_play_values(spiel, table) if with_values else {}
    groups: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    worth: dict[str, dict[str, list[tuple[float, float]]]] = defaultdict(lambda: defaultdict(list))
    for (player, key), state in information_states(spiel).items():
        name = _group(state, player)
        for action, p in policy.action_probabilities(state, player).items():
            groups[name][state.action_to_string(player, action)].append(p)
        reach, action_values = values.get((player, key), (0.0, {}))
        for action, v in action_values.items():
            worth[name][state.action_to_string(player, action)].append((reach, v))
    head = f"| cards; legal actions ({folder}) | " + " | ".join(ACTIONS)
    if with_values:
        head += " | reach | " + " | ".join(f"{a}: chips" for a in ACTIONS)
    print(head + " |")
    print("|---|" + "---|" * (len(ACTIONS) * (2 if with_values else 1) + with_values))
    for name in sorted(groups):
        probs = groups[name]
        line = f"| {name} | " + " | ".join(f"{statistics.mean(probs[a]):.2f}" if a in probs else "-" for a in ACTIONS)
        if with_values:
            reach = sum(r for r, _ in next(iter(worth[name].values()), []))
            line += f" | {reach:.3f} | " + " | ".join(
                f"{sum(r * v for r, v in worth[name][a]) / reach:+.2f}" if reach and a in worth[name] else "-"
                for a in ACTIONS)
        print(line + " |")
    print(f"exploitability {exploitability.exploitability(spiel, table):.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
