"""A real throwaway third-party distribution: built, installed, discovered, selected, used, uninstalled.

No monkeypatching: the distribution goes through pip and importlib-metadata like a user's would.
"""

import json
import subprocess
import sys
import textwrap

DIST = "omrl-thirdparty-demo"
PKG = "omrl_thirdparty_demo"

PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST}"
version = "0.4.2"

[project.entry-points."openmanus_rl.envs"]
tp_countdown = "{PKG}.components:CountdownEnv"
tp_broken = "{PKG}.broken:Env"

[project.entry-points."openmanus_rl.rewards"]
tp_turns = "{PKG}.components:TurnsReward"

[project.entry-points."openmanus_rl.templates"]
tp_plain = "{PKG}.components:PlainTemplate"

[project.entry-points."openmanus_rl.allocators"]
tp_first = "{PKG}.components:first_token"

[project.entry-points.openmanus_rl]
{PKG} = "{PKG}.hooks"

[tool.setuptools]
packages = ["{PKG}"]

[tool.setuptools.package-data]
{PKG} = ["configs/**/*.yaml"]
"""

COMPONENTS = '''
from openmanus_rl_core.protocols import ParsedAction, StepResult


class CountdownEnv:
    """Say the numbers from start down to 0, one per turn."""

    instruction = "Count down to zero, one number per action."

    def __init__(self, start=3):
        self.start = start
        self.n = start

    def reset(self, task_id=None, seed=None):
        self.n = self.start + (task_id or 0)
        return f"Start at {self.n}."

    def step(self, action):
        if action.strip() == str(self.n):
            self.n -= 1
            done = self.n < 0
            return StepResult("Done." if done else f"Next: {self.n}", 1.0 if done else 0.0, done, {"success": done} if done else {})
        return StepResult("Wrong number.", 0.0, False, {"invalid": True})

    def oracle_action(self):
        return str(self.n)

    def close(self):
        pass


class TurnsReward:
    def __init__(self, per_turn=-0.1):
        self.per_turn = per_turn

    def compute(self, trajectory):
        return self.per_turn * len(trajectory.turns)


class PlainTemplate:
    stop = ["\\n"]

    def system_prompt(self, instruction):
        return "Reply with the action only. " + instruction

    def parse(self, text):
        line = text.strip().splitlines()[0].strip() if text.strip() else ""
        return ParsedAction("action" if line else "invalid", line if line else text, bool(line))

    def render(self, action, thought=""):
        return action + "\\n"


def first_token(reward, turn_rewards, segments, length):
    out = [0.0] * length
    for start, end in segments:
        if end > start:
            out[start] = reward
            break
    return out
'''

HOOKS = '''
from pathlib import Path

from openmanus_rl_core.hookspecs import hookimpl


@hookimpl
def openmanus_rl_config_dirs():
    return [str(Path(__file__).parent / "configs")]
'''

ENV_YAML = """
name: tp_countdown
kwargs:
  start: 2
max_turns: 6
train_tasks: 4
val_tasks: 2
"""


def _cli(cli_env, *args):
    return subprocess.run(["openmanus-rl", *args], capture_output=True, text=True, env=cli_env, timeout=120)


def test_thirdparty_plugin_is_found_selected_used_and_gone_after_uninstall(throwaway_dists, cli_env):
    throwaway_dists.install(DIST, {
        "pyproject.toml": PYPROJECT, f"{PKG}/__init__.py": "", f"{PKG}/components.py": COMPONENTS,
        f"{PKG}/hooks.py": HOOKS, f"{PKG}/configs/env/tp_countdown.yaml": ENV_YAML,
        f"{PKG}/broken.py": "raise ImportError('tp_broken needs libfoo, which is not installed')\nEnv = None\n",
    })
    # 1. listed through metadata, with its distribution and version
    listed = _cli(cli_env, "plugins", "--json")
    assert listed.returncode == 0, listed.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(listed.stdout)}
    for kind, name in [("env", "tp_countdown"), ("reward", "tp_turns"), ("template", "tp_plain"),
                       ("allocator", "tp_first"), ("hooks", PKG)]:
        assert rows[(kind, name)]["distribution"] == DIST
        assert rows[(kind, name)]["version"] == "0.4.2"
    # the broken entry is listed; --check imports it and marks it broken, the others stay ok
    assert ("env", "tp_broken") in rows
    checked = {(r["kind"], r["name"]): r for r in json.loads(_cli(cli_env, "plugins", "--json", "--check").stdout)}
    assert checked[("env", "tp_broken")]["status"] == "broken"
    assert "libfoo" in checked[("env", "tp_broken")]["error"] and DIST in checked[("env", "tp_broken")]["error"]
    assert checked[("env", "tp_countdown")]["status"] == "ok"

    # 2. its Hydra config option resolves through the search-path hook, with no edit of configs/
    shown = _cli(cli_env, "train", "--cfg", "job", "env=tp_countdown", "template=tp_plain_cfg")
    assert shown.returncode != 0  # there is no template option of that name: Hydra says so
    shown = _cli(cli_env, "train", "--cfg", "job", "env=tp_countdown")
    assert shown.returncode == 0, shown.stderr
    assert "name: tp_countdown" in shown.stdout and "start: 2" in shown.stdout

    # 3. used: compose, build every component by name, run an oracle episode, score and allocate it
    script = textwrap.dedent(f"""
        from openmanus_rl_core.config.loading import compose
        from openmanus_rl_core.plugin.registry import registry
        from openmanus_rl_core.protocols import Trajectory, Turn
        cfg = compose(["env=tp_countdown"])
        env = registry("env").build(cfg.env.name, **cfg.env.kwargs)
        tpl = registry("template").build("tp_plain")
        rew = registry("reward").build("{DIST}:tp_turns", per_turn=-0.5)
        alloc = registry("allocator").get("tp_first")
        obs = env.reset(task_id=1, seed=0)
        traj = Trajectory(task_id=1, seed=0, group_id=0, initial_observation=obs)
        pos = 0
        while True:
            reply = tpl.render(env.oracle_action())
            act = tpl.parse(reply)
            r = env.step(act.content)
            traj.turns.append(Turn(reply, act, r.observation, r.reward, r.done, r.info, (pos, pos + 2)))
            pos += 4
            if r.done:
                break
        print(obs, len(traj.turns), r.info["success"], rew.compute(traj), alloc(1.0, [], traj.segments, pos)[:5])
    """)
    used = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env, timeout=120)
    assert used.returncode == 0, used.stderr
    assert used.stdout.strip() == "Start at 3. 4 True -2.0 [1.0, 0.0, 0.0, 0.0, 0.0]"

    # 4. uninstalled: gone from the listing and from Hydra
    assert throwaway_dists.uninstall(DIST).returncode == 0
    rows = {(r["kind"], r["name"]) for r in json.loads(_cli(cli_env, "plugins", "--json").stdout)}
    assert ("env", "tp_countdown") not in rows and ("reward", "tp_turns") not in rows
    gone = _cli(cli_env, "train", "--cfg", "job", "env=tp_countdown")
    assert gone.returncode != 0 and "tp_countdown" in gone.stderr


EXITING_DIST = "omrl-exiting-demo"
EXITING_PKG = "omrl_exiting_demo"
EXITING_PYPROJECT = f"""
[build-system]
requires = ["setuptools>=61"]
build-backend = "setuptools.build_meta"

[project]
name = "{EXITING_DIST}"
version = "0.0.1"

[project.entry-points."openmanus_rl.envs"]
exiting_env = "{EXITING_PKG}.env:Env"

[project.entry-points.openmanus_rl]
{EXITING_PKG} = "{EXITING_PKG}.hooks"

[tool.setuptools]
packages = ["{EXITING_PKG}"]
"""


def test_a_plugin_that_exits_on_import_is_reported_and_ends_no_command(throwaway_dists, cli_env, tmp_path):
    """sys.exit() / SystemExit at import time, in a component and in a hook module: a PluginLoadError naming the
    distribution and the entry point, never the plugin's exit code with no message."""
    throwaway_dists.install(EXITING_DIST, {
        "pyproject.toml": EXITING_PYPROJECT, f"{EXITING_PKG}/__init__.py": "",
        f"{EXITING_PKG}/env.py": "raise SystemExit(3)\nEnv = None\n",
        f"{EXITING_PKG}/hooks.py": "import sys\nsys.exit(7)\n",
    })
    checked = _cli(cli_env, "plugins", "--json", "--check")
    assert checked.returncode == 0, checked.stderr
    rows = {(r["kind"], r["name"]): r for r in json.loads(checked.stdout)}
    env_row, hook_row = rows[("env", "exiting_env")], rows[("hooks", EXITING_PKG)]
    assert env_row["status"] == hook_row["status"] == "broken"
    assert env_row["error"] == (f"env plugin 'exiting_env' from distribution {EXITING_DIST} 0.0.1 (entry point "
                                f"exiting_env = {EXITING_PKG}.env:Env in group openmanus_rl.envs) failed to load: "
                                f"SystemExit: 3")
    assert (f"(entry point {EXITING_PKG} = {EXITING_PKG}.hooks in group openmanus_rl) failed to load: SystemExit: 7"
            in hook_row["error"])
    assert rows[("env", "key_door")]["status"] == "ok"

    # every command loads the hook plugins: the broken one is skipped with a warning naming it, the command runs
    shown = _cli(cli_env, "train", "--cfg", "job", "env=key_door")
    assert shown.returncode == 0, shown.stderr
    assert "name: key_door" in shown.stdout
    assert f"hook plugin skipped: hooks plugin '{EXITING_PKG}' from distribution {EXITING_DIST}" in shown.stderr

    # using the broken component raises that error in the caller, which goes on
    script = textwrap.dedent("""
        from openmanus_rl_core.plugin.registry import PluginLoadError, registry
        try:
            registry("env").get("exiting_env")
        except PluginLoadError as exc:
            print("caught:", exc)
        print("still running")
    """)
    used = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=cli_env, timeout=120)
    assert used.returncode == 0, used.stderr
    assert used.stdout.endswith("failed to load: SystemExit: 3\nstill running\n")
    assert used.stdout.startswith(f"caught: env plugin 'exiting_env' from distribution {EXITING_DIST} 0.0.1")
