"""Measure real AgentGym servers through this project's client: the numbers in docs/agentgym.md.

    python bench/agentgym_real.py textcraft --url http://127.0.0.1:36101 --tokenizer /path/tokenizer.json --tasks 100
    python bench/agentgym_real.py babyai --url http://127.0.0.1:36102 --tokenizer /path/tokenizer.json --tasks 100

The servers are AgentGym's own (docs/agentgym.md says how to install and start them; never a dependency of this
project). Per task ``0 .. tasks-1``: the first observation's size (characters and tokens of ``--tokenizer``, a
Hugging Face ``tokenizer.json``), then a scripted episode through :class:`AgentGymEnv`:

- textcraft: a solver over the task's own crafting commands (``textcraft_solve``), i.e. an expert's episode
  length;
- babyai: take the available action that names the goal's object (``go to`` / ``pick up`` / ``open`` / ``toggle``
  as the mission says), else explore (``turn left`` every fourth step, ``move forward`` otherwise).

Prints, as JSON: first-observation tokens and characters (min / median / max), turns of successful episodes
(min / median / p90 / max), success rate, each final reward seen at success, later observations' tokens, whether the
OpenAPI schema lists POST /close, and the server's RSS growth per episode with and without /close (``--pid``).
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from openmanus_rl_env_agentgym import AgentGymEnv  # noqa: E402

RECIPE = re.compile(r"craft (\d+) (.+?) using (.+)")


def textcraft_solve(env: AgentGymEnv, observation: str, max_turns: int) -> list:
    """Play the task with its own crafting commands: craft bottom-up, each recipe as written (repeated as often as
    needed); ``get`` what no command makes, or, when the server has none of it (a generic ingredient such as
    "planks"), a kind of it that a command makes. Returns the step results."""
    commands, _, goal = observation.rpartition("Goal: craft ")
    recipes: dict[str, tuple[int, list[tuple[int, str]], str]] = {}
    for line in commands.splitlines():
        m = RECIPE.match(line.strip())
        if m and m.group(2) not in recipes:
            ings = [(int(n), item) for n, item in (p.strip().split(" ", 1) for p in m.group(3).split(","))]
            recipes[m.group(2)] = (int(m.group(1)), ings, line.strip())
    results: list = []

    def act(action: str):
        if len(results) >= max_turns or (results and results[-1].done):
            raise StopIteration
        results.append(env.step(action))
        return results[-1]

    def make(item: str, count: int, depth: int = 0) -> None:
        if item in recipes and depth < 8:
            out, ings, line = recipes[item]
            for _ in range(-(-count // out)):
                for n, ing in ings:
                    make(ing, n, depth + 1)
                act(line)
            return
        if "Could not find" in act(f"get {count} {item}").observation:
            kind = next((k for k in recipes if k.endswith(" " + item)), None)
            if kind is not None:
                make(kind, count, depth + 1)

    try:
        make(goal.strip().rstrip("."), 1)
    except StopIteration:
        pass
    return results


def babyai_action(observation: str, turn: int) -> str:
    goal = re.search(r"Your goal: (.+)", observation)
    available = re.findall(r'"([^"]+)"', observation.rpartition("Available actions:")[2])
    mission = goal.group(1) if goal else ""
    for verb in ("pick up", "open", "go to", "toggle"):
        for act in available:
            obj = re.sub(r" \d+$", "", act.replace(verb, "", 1)).strip()
            if act.startswith(verb) and obj and obj in mission:
                return act
    for act in available:  # a door or key on the way
        if act.startswith(("toggle and go through", "go through")):
            return act
    return "turn left" if turn % 4 == 3 else "move forward"


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def episode(env_name: str, url: str, task: int, tok, max_turns: int, close: bool = True) -> dict:
    env = AgentGymEnv(env_name, base_url=url, timeout=60)
    if not close:
        env._has_close = lambda: False  # measure what an unclosed env costs the server
    first = env.reset(task)
    if env_name == "textcraft":
        results = textcraft_solve(env, first, max_turns)
    else:
        results, obs = [], first
        for turn in range(max_turns):
            results.append(env.step(babyai_action(obs, turn)))
            obs = results[-1].observation
            if results[-1].done:
                break
    env.close()
    res = results[-1] if results else None
    turn = len(results) - 1
    obs_tokens = [len(tok.encode(r.observation).ids) if tok else 0 for r in results]
    return {"task": task, "first_chars": len(first), "first_tokens": len(tok.encode(first).ids) if tok else 0,
            "turns": turn + 1, "success": bool(res and res.info.get("success")), "done": bool(res and res.done),
            "score": res.info.get("score") if res else None, "obs_tokens": obs_tokens,
            "goal_last": first.rstrip().splitlines()[-1].startswith("Goal:")}


def spread(xs: list[float]) -> dict:
    if not xs:
        return {}
    return {"min": min(xs), "median": statistics.median(xs), "p90": sorted(xs)[int(0.9 * (len(xs) - 1))],
            "max": max(xs)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("env", choices=["textcraft", "babyai"])
    p.add_argument("--url", required=True)
    p.add_argument("--tokenizer", default=None, help="a Hugging Face tokenizer.json")
    p.add_argument("--tasks", type=int, default=100)
    p.add_argument("--start", type=int, default=0)
    p.add_argument("--max-turns", type=int, default=40)
    p.add_argument("--pid", type=int, default=None, help="the server's pid, for its RSS per episode")
    a = p.parse_args()
    tok = None
    if a.tokenizer:
        from tokenizers import Tokenizer

        tok = Tokenizer.from_file(a.tokenizer)
    eps = [episode(a.env, a.url, t, tok, a.max_turns) for t in range(a.start, a.start + a.tasks)]
    wins = [e for e in eps if e["success"]]
    probe = AgentGymEnv(a.env, base_url=a.url)
    out = {
        "env": a.env, "tasks": f"{a.start}..{a.start + a.tasks - 1}",
        "first_observation_tokens": spread([e["first_tokens"] for e in eps]),
        "first_observation_chars": spread([e["first_chars"] for e in eps]),
        "goal_in_last_line": sum(e["goal_last"] for e in eps) / len(eps),
        "success_rate": len(wins) / len(eps),
        "turns_of_successes": spread([e["turns"] for e in wins]),
        "done_without_success": sum(e["done"] and not e["success"] for e in eps),
        "final_scores_at_success": sorted({round(e["score"], 4) for e in wins})[:12],
        "later_observation_tokens": spread([n for e in eps for n in e["obs_tokens"]]),
        "openapi_has_close": probe._has_close(),
    }
    if a.pid:
        for close in (True, False):
            before = rss_kb(a.pid)
            for t in range(200):
                episode(a.env, a.url, t % 50, None, 3, close=close)
            out[f"rss_kb_per_episode_{'closed' if close else 'unclosed'}"] = (rss_kb(a.pid) - before) / 200
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
