"""Benchmark: tic-tac-toe after self-play only, non-loss against OpenSpiel's MCTS bot and a random player (issue 54).

    python bench/tictactoe.py [--seeds 0,1,2] [--games 200] [--out DIR] [hydra overrides ...]
    python bench/tictactoe.py --runs DIR,DIR [--games 200]     # evaluate finished runs, train nothing
    python bench/tictactoe.py --reference [--games 200]        # hand-written players against the same opponents

Each seed is ``openmanus-rl train +experiment=tictactoe_selfplay seed=<s>`` (docs/selfplay.md) with the overrides
given, run to its end in a fresh process; then its last checkpoint plays ``--games`` games against each opponent,
half of them in each seat, greedy (``openmanus-rl eval +experiment=tictactoe_selfplay trainer.checkpoint=<run>
env.val_tasks=<games>``, with ``env.kwargs.val_opponent=random`` for the random rows). The table gives non-loss (a
win or a draw: ``reward/outcome/non_loss/mean``) overall and by seat, and the wins, draws and losses; the goals
are non-loss of at least 0.8 against MCTS (100 simulations a move) and 0.95 against random.

``--reference`` plays hand-written policies instead, through the env itself (its seats, opponents and seeds):
uniformly random moves, and a rule that takes a winning cell, else blocks the opponent's, else takes the centre,
else plays at random.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

OPPONENTS = {"MCTS, 100 simulations": [], "random": ["env.kwargs.val_opponent=random"]}
GOALS = {"MCTS, 100 simulations": 0.8, "random": 0.95}
LINES = [(0, 1, 2), (3, 4, 5), (6, 7, 8), (0, 3, 6), (1, 4, 7), (2, 5, 8), (0, 4, 8), (2, 4, 6)]


def cli(*args: str, log: Path) -> None:
    cmd = [sys.executable, "-m", "openmanus_rl_core.cli", *args]
    with open(log, "a") as out:
        code = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT).returncode
    if code:
        raise SystemExit(f"{' '.join(args)} failed ({code}); see {log}")


def train(seed: int, run_dir: Path, overrides: list[str]) -> float:
    run_dir.mkdir(parents=True, exist_ok=True)
    args = ["train", "+experiment=tictactoe_selfplay", f"seed={seed}", "trainer.progress=false",
            f"trainer.run_dir={run_dir}", *overrides]
    print(f"  load {os.getloadavg()[0]:.1f}: seed {seed}: {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    cli(*args, log=run_dir / "bench.log")
    return time.perf_counter() - t0


def evaluate(run_dir: Path, games: int) -> dict[str, dict]:
    """The run's last checkpoint against each opponent: the outcome metrics of ``openmanus-rl eval``."""
    out = {}
    for name, extra in OPPONENTS.items():
        path = run_dir / f"eval_{'mcts' if not extra else 'random'}_{games}.json"
        cli("eval", "+experiment=tictactoe_selfplay", f"trainer.checkpoint={run_dir}", f"env.val_tasks={games}",
            f"trainer.eval_output={path}", *extra, log=run_dir / "bench.log")
        metrics = json.loads(path.read_text())
        out[name] = {k.split("outcome/", 1)[1]: v for k, v in metrics.items() if "reward/outcome/" in k}
    return out


def _winning(cells: str, mark: str, legal: list[int]) -> int | None:
    for line in LINES:
        marks = [cells[i] for i in line]
        if marks.count(mark) == 2 and marks.count(".") == 1 and line[marks.index(".")] in legal:
            return line[marks.index(".")]
    return None


def rule(env, rng: random.Random) -> int:
    """Win, else block, else the centre, else a random legal cell."""
    state, me = env.state, env.own
    legal = state.legal_actions(me)
    cells = state.observation_string(me).replace("\n", "")
    mine, theirs = ("x", "o") if me == 0 else ("o", "x")
    for mark in (mine, theirs):
        cell = _winning(cells, mark, legal)
        if cell is not None:
            return cell
    return 4 if 4 in legal else rng.choice(legal)


def reference(games: int) -> dict[str, dict[str, dict]]:
    from openmanus_rl_env_openspiel import OpenSpielEnv

    players = {"uniformly random": lambda env, rng: rng.choice(env.state.legal_actions(env.own)),
               "win, else block, else centre": rule}
    out: dict[str, dict[str, dict]] = {}
    for who, play in players.items():
        for name, extra in OPPONENTS.items():
            env = OpenSpielEnv(game="tic_tac_toe", opponent="random" if extra else "bot:mcts", simulations=100)
            counts = {"win": 0, "draw": 0, "loss": 0, "seat0/non_loss": 0, "seat1/non_loss": 0}
            for task in range(games):
                env.reset(task_id=task)
                rng = random.Random(task)
                while True:
                    result = env.step(env.state.action_to_string(env.own, play(env, rng)))
                    if result.done:
                        break
                ret = result.info["score"]
                counts["win" if ret > 0 else "draw" if ret == 0 else "loss"] += 1
                counts[f"seat{env.own}/non_loss"] += ret >= 0
            half = games / 2
            out.setdefault(who, {})[name] = {
                "non_loss/mean": (counts["win"] + counts["draw"]) / games, "win/mean": counts["win"] / games,
                "draw/mean": counts["draw"] / games, "loss/mean": counts["loss"] / games,
                "seat0/non_loss/mean": counts["seat0/non_loss"] / half,
                "seat1/non_loss/mean": counts["seat1/non_loss"] / half}
    return out


def table(results: dict[str, dict[str, dict]]) -> str:
    lines = ["| policy | opponent | non-loss | seat 0 | seat 1 | win | draw | loss | goal |",
             "|---|---|---|---|---|---|---|---|---|"]
    for who, rows in results.items():
        for name, m in rows.items():
            cells = [m.get(k) for k in ("non_loss/mean", "seat0/non_loss/mean", "seat1/non_loss/mean", "win/mean",
                                        "draw/mean", "loss/mean")]
            met = "met" if m["non_loss/mean"] >= GOALS[name] else f"not met (>= {GOALS[name]})"
            lines.append(f"| {who} | {name} | " + " | ".join(f"{c:.3f}" if c is not None else "-" for c in cells)
                         + f" | {met} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--games", type=int, default=200, help="games against each opponent, half in each seat")
    ap.add_argument("--out", default=None, help="folder of the runs (default outputs/bench_tictactoe/<time>)")
    ap.add_argument("--runs", default=None, help="comma-separated finished run folders: evaluate them, train nothing")
    ap.add_argument("--reference", action="store_true", help="hand-written players, no model")
    ap.add_argument("overrides", nargs="*", help="hydra overrides of every training run")
    args = ap.parse_args()
    if args.games < 2 or args.games % 2:
        raise SystemExit(f"--games={args.games}: must be an even number of at least 2 (half in each seat)")
    if args.reference:
        print(table(reference(args.games)))
        return 0
    results: dict[str, dict[str, dict]] = {}
    if args.runs:
        runs = [Path(r) for r in args.runs.split(",")]
        missing = [str(r) for r in runs if not (r / "checkpoints").is_dir()]
        if missing:
            raise SystemExit(f"--runs: no checkpoints/ in {', '.join(missing)}")
    else:
        out = Path(args.out or f"outputs/bench_tictactoe/{time.strftime('%Y%m%d-%H%M%S')}")
        runs = []
        for seed in [int(s) for s in args.seeds.split(",")]:
            run_dir = out / f"seed{seed}"
            wall = train(seed, run_dir, list(args.overrides))
            print(f"  seed {seed}: trained in {wall / 60:.1f} minutes", flush=True)
            runs.append(run_dir)
    for run_dir in runs:
        results[str(run_dir)] = evaluate(run_dir, args.games)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
