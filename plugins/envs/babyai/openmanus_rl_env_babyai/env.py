"""``babyai``: BabyAI levels (the ``minigrid`` PyPI package) in-process, in AgentGym's text.

First observation: ``"Your goal: <mission>\\n<description>\\nAvailable actions: [\\"turn left\\", ...]"``; each step's
observation is the new description (plus ``"\\n The task is completed."`` at the end) and the available actions.
Actions (high level, each a sequence of minigrid primitives): ``turn left``, ``turn right``, ``move forward``,
``go to <obj> <k>``, ``pickup <obj> <k>`` (``pick up`` is read the same), ``drop``, ``go through <door> <k>``,
``toggle and go through <door> <k>``, ``toggle``, ``go to goal``, ``check available actions``.

Task ids are AgentGym's data indices: task ``t`` is level ``levels[t % len(levels)]`` reset with seed
``t // len(levels)``; the default ``levels`` are AgentGym's 40, in its order. BabyAI has no split of its own; ids
below ``train_tasks`` (a multiple of ``len(levels)``) are training tasks, ids above use unseen seeds.

Success: minigrid ended the episode with the mission done (its reward, ``1 - 0.9 * steps / max_steps``, is below 1
and is the step's reward). The level's own step limit ends the episode without success.
"""

from __future__ import annotations

import copy
import logging
import random
from typing import Any, Sequence

import gymnasium as gym
import minigrid  # noqa: F401  (registers the BabyAI-* ids)
from minigrid.core.constants import COLOR_NAMES
from minigrid.envs.babyai.core import roomgrid_level
from minigrid.utils.baby_ai_bot import BabyAIBot

from openmanus_rl_core.protocols import StepResult

from openmanus_rl_env_babyai.describe import describe
from openmanus_rl_core.protocols import as_text

AGENTGYM_LEVELS = (
    "BabyAI-GoToRedBallGrey-v0", "BabyAI-GoToRedBall-v0", "BabyAI-GoToRedBallNoDists-v0", "BabyAI-GoToObjS6-v1",
    "BabyAI-GoToLocalS8N7-v0", "BabyAI-GoToObjMazeS7-v0", "BabyAI-GoToImpUnlock-v0", "BabyAI-GoToSeqS5R2-v0",
    "BabyAI-GoToRedBlueBall-v0", "BabyAI-GoToDoor-v0", "BabyAI-GoToObjDoor-v0", "BabyAI-Open-v0",
    "BabyAI-OpenRedDoor-v0", "BabyAI-OpenDoorLoc-v0", "BabyAI-OpenRedBlueDoorsDebug-v0",
    "BabyAI-OpenDoorsOrderN4Debug-v0", "BabyAI-Pickup-v0", "BabyAI-UnblockPickup-v0", "BabyAI-PickupLoc-v0",
    "BabyAI-PickupDistDebug-v0", "BabyAI-PickupAbove-v0", "BabyAI-PutNextLocalS6N4-v0",
    "BabyAI-PutNextS7N4Carrying-v0", "BabyAI-Unlock-v0", "BabyAI-UnlockLocalDist-v0", "BabyAI-KeyInBox-v0",
    "BabyAI-UnlockPickupDist-v0", "BabyAI-BlockedUnlockPickup-v0", "BabyAI-UnlockToUnlock-v0",
    "BabyAI-ActionObjDoor-v0", "BabyAI-FindObjS7-v0", "BabyAI-KeyCorridorS6R3-v0", "BabyAI-OneRoomS20-v0",
    "BabyAI-MoveTwoAcrossS8N9-v0", "BabyAI-SynthS5R2-v0", "BabyAI-SynthLoc-v0", "BabyAI-SynthSeq-v0",
    "BabyAI-MiniBossLevel-v0", "BabyAI-BossLevel-v0", "BabyAI-BossLevelNoUnlock-v0",
)
"""AgentGym's BabyAI levels 1..40, in its order (its ``data_idx % 40`` picks one); minigrid 3.2 names its
GoToObjS6 level ``-v1``."""

SEEDS_PER_LEVEL = 1_000_000
"""``num_tasks = len(levels) * SEEDS_PER_LEVEL``: enough ids that train and validation never share a seed."""

INSTRUCTION = (
    "You are an exploration master that wants to finish every goal you are given. Every round I will give you an "
    "observation, and you have to respond an action and your thought based on the observation to finish the given "
    "task. You are placed in a room and you need to accomplish the given goal with actions. You can use the "
    'following actions: - turn right - turn left - move forward - go to <obj> <id> - pick up <obj> <id> - go '
    "through <door> <id>: <door> must be an open door. - toggle and go through <door> <id>: <door> can be a closed "
    "door or a locked door. If you want to open a locked door, you need to carry a key that is of the same color as "
    "the locked door. - toggle: there is a closed or locked door right in front of you and you can toggle it."
)
MAX_ACTION_CHARS = 256


def _text(action: Any) -> str:
    text = " ".join(as_text(action).split()).lower()
    return "pickup" + text[len("pick up"):] if text.startswith("pick up ") else text


def _action_list(actions: dict[str, list[int]]) -> str:
    return "\nAvailable actions: [" + ", ".join(f'"{a}"' for a in actions) + "]"


log = logging.getLogger(__name__)


def _layout_redrawn(*args: Any) -> None:
    """minigrid prints a line each time it rejects a random room layout and draws another ("Sampling rejected:
    unreachable object at (4, 6)"); on GoToLocal, many resets do. The redraw is routine, so it goes to the debug log
    instead of flooding a run's output."""
    log.debug("minigrid redrew a layout: %s", " ".join(map(str, args)))


roomgrid_level.print = _layout_redrawn  # shadows the builtin for that module only


class BabyAIEnv:
    """BabyAI through AgentGym's text interface; see the module docstring.

    kwargs: ``levels`` (minigrid ids, default AgentGym's 40), ``show_actions`` (append the available actions to
    every observation, as AgentGym does).
    """

    instruction = INSTRUCTION
    demonstrators = {"first_of_kind": "goes to the nearest object of the kind the mission names, whatever its colour "
                                      "(turns like the oracle while none is in view)"}
    """Systematic suboptimal demonstrators (``warmup.demonstrator=<name>``), played by :meth:`demonstrator_action`."""

    def __init__(self, levels: Sequence[str] | None = None, show_actions: bool = True):
        self.levels = tuple(AGENTGYM_LEVELS if levels is None else levels)
        if not self.levels:
            raise ValueError("levels is empty: give at least one BabyAI level id")
        unknown = [name for name in self.levels if name not in gym.registry or not name.startswith("BabyAI-")]
        if unknown:
            known = sorted(e for e in gym.registry if e.startswith("BabyAI-"))
            raise ValueError(f"levels {unknown} are not BabyAI level ids; known: {', '.join(known[:8])}, ... "
                             f"({len(known)} ids)")
        self.show_actions = bool(show_actions)
        self.num_tasks = len(self.levels) * SEEDS_PER_LEVEL
        self._envs: dict[str, Any] = {}
        self.env: Any = None
        self.bot: BabyAIBot | None = None
        self.suggested: int | None = None
        self.done = True
        self.success = False
        self.actions: dict[str, list[int]] = {}
        self.errors: dict[str, str] = {}

    def level_and_seed(self, task_id: int) -> tuple[str, int]:
        t = int(task_id) % self.num_tasks
        return self.levels[t % len(self.levels)], t // len(self.levels)

    def task_fields(self, task_id: int) -> dict:
        level, seed = self.level_and_seed(task_id)
        return {"data_source": "babyai", "extra": {"level": level, "level_seed": seed}}

    # -------------------------------------------------------------------------------------------- env
    def reset(self, task_id: int | None = None, seed: int | None = None) -> str:
        if task_id is None:
            task_id = random.Random(0 if seed is None else seed).randrange(self.num_tasks)
        try:
            level, level_seed = self.level_and_seed(int(task_id))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"task_id={task_id!r} is not an int: pass an int in [0, {self.num_tasks}) or None") from exc
        if level not in self._envs:
            self._envs[level] = gym.make(level)
        self.env = self._envs[level]
        self.env.reset(seed=level_seed)
        self.bot = BabyAIBot(self.env)
        self.suggested = None
        self.done = False
        self.success = False
        mission = self.env.unwrapped.mission.replace("then", "and").replace("after you", "and")
        self.mission = mission
        text, self.actions, self.errors = describe(self.env)
        return f"Your goal: {mission}\n{text}" + self._listing()

    def _listing(self) -> str:
        return _action_list(self.actions) if self.show_actions else ""

    def step(self, action: Any) -> StepResult:
        if self.env is None:
            return StepResult("No episode: call reset() first.", 0.0, True, {"invalid": True, "success": False})
        if self.done:
            return StepResult("The episode is over.", 0.0, True, {"invalid": True, "success": self.success})
        text = _text(action)
        if len(text) > MAX_ACTION_CHARS:
            text = ""
        if "check" in text:
            listing = "You can take the following actions: " + ", ".join(self.actions)
            return StepResult(listing + self._listing(), 0.0, False, {"invalid": False})
        if text not in self.actions:
            why = ("No change in state." if text == "" else
                   self.errors.get(text, "The action is not recognized. Please check valid actions."))
            return StepResult(why + self._listing(), 0.0, False, {"invalid": True})
        reward, ended, truncated = self._run(self.actions[text])
        description, self.actions, self.errors = describe(self.env)
        info: dict[str, Any] = {"invalid": False}
        if ended or truncated:
            self.done = True
            self.success = ended and reward > 0
            info.update(success=self.success, level_steps=int(self.env.unwrapped.step_count))
            if self.success:
                description += "\n The task is completed."
        return StepResult(description + self._listing(), float(reward), self.done, info)

    def _run(self, primitives: list[int]) -> tuple[float, bool, bool]:
        """Run the primitives until one changes nothing the agent sees or the level ends."""
        reward, ended, truncated = 0.0, False, False
        for p in primitives:
            before = self.env.unwrapped.gen_obs()["image"]
            _, reward, ended, truncated, _ = self.env.step(p)
            self._tell_bot(p)
            if ended or truncated or (self.env.unwrapped.gen_obs()["image"] == before).all():
                break
        return float(reward), bool(ended), bool(truncated)

    def _tell_bot(self, primitive: int) -> None:
        try:
            self.suggested = self.bot.replan(primitive) if self.bot is not None else None
        except Exception:  # the bot gives up on states it cannot plan from; the oracle then only looks ahead
            self.bot, self.suggested = None, None

    def oracle_action(self) -> str:
        """A high-level action that finishes the mission now if there is one, else the bot's next primitive."""
        if self.env is None or self.done:
            return "turn left"
        finishing = []
        for name, primitives in self.actions.items():
            if primitives and self._may_finish(name) and self._finishes(primitives):
                finishing.append((len(primitives), name))
        if finishing:
            return min(finishing)[1]
        if self.bot is not None and self.suggested is None:
            try:
                self.suggested = self.bot.replan()
            except Exception:
                self.bot = None
        single = {tuple(p): name for name, p in self.actions.items() if len(p) == 1}
        return single.get((self.suggested,), "turn left")

    def demonstrator_action(self, name: str) -> str:
        """The next action of the demonstrator ``name`` (one of :attr:`demonstrators`). ``first_of_kind``: the first
        ``go to`` of an object of the mission's kind (the description lists them nearest first), ignoring colour; its
        success on GoToLocal is the chance that the nearest object of that kind is the one named."""
        if name not in self.demonstrators:
            raise ValueError(f"demonstrator {name!r}: BabyAI offers {', '.join(self.demonstrators)}")
        if self.env is None or self.done:
            return "turn left"
        kinds = set(self.mission.split()) & {"ball", "box", "key", "door"}
        for action in self.actions:
            if action.startswith("go to ") and action.split()[-2] in kinds:
                return action
        return self.oracle_action()

    def _may_finish(self, action: str) -> bool:
        """Whether ``action``'s object fits the mission's words (its kind, and its colour when the mission names
        one); only those are simulated, which keeps the oracle cheap."""
        words = action.split()
        if not words[-1].isdigit():
            return True
        kind, color = words[-2], words[-3] if words[-3] not in ("open", "closed", "locked") else words[-4]
        mission = set(self.mission.split())
        return kind in mission and (color in mission or not mission & set(COLOR_NAMES))

    def _finishes(self, primitives: list[int]) -> bool:
        trial = copy.deepcopy(self.env.unwrapped)
        for p in primitives:
            _, reward, ended, truncated, _ = trial.step(p)
            if ended or truncated:
                return ended and reward > 0
        return False

    def close(self) -> None:
        self.done = True
        for env in self._envs.values():
            env.close()
        self._envs.clear()
