"""What the agent sees and may do in a BabyAI grid, in AgentGym's words.

:func:`describe` turns the agent's egocentric view into (description, actions): the visible objects ordered by
distance with their offsets (``There is a red ball 1 3 steps in front of you and 1 steps to your left.``), the
barrier it faces, what it carries; and the high-level actions available now, each mapped to the minigrid primitive
actions that carry it out (``go to red ball 1`` is a shortest path that ends facing the ball), plus an answer for each
action that is not available now.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import numpy as np
from minigrid.core.constants import IDX_TO_COLOR, IDX_TO_OBJECT, STATE_TO_IDX

LEFT, RIGHT, FORWARD, PICKUP, DROP, TOGGLE = 0, 1, 2, 3, 4, 5
DIRS = [np.array((1, 0)), np.array((0, 1)), np.array((-1, 0)), np.array((0, -1))]
IDX_TO_STATE = {v: k for k, v in STATE_TO_IDX.items()}
NAMED = ("door", "key", "ball", "box", "goal", "lava", "wall")
BLOCKING = ("wall", "box", "lava", "ball", "key")
"""Words in an object's name that make its cell impassable for the path finder."""


@dataclass
class Seen:
    name: str
    pos: tuple[int, int]
    dist: int


def _blocked(name: str) -> bool:
    return any(word in name for word in BLOCKING)


def describe(env) -> tuple[str, dict[str, list[int]], dict[str, str]]:
    """``(description, {action: primitive actions}, {unavailable action: why})`` for ``env`` (a minigrid env)."""
    u = env.unwrapped
    image = u.gen_obs()["image"]
    size = u.agent_view_size
    pos = np.array(u.agent_pos)
    direction = int(u.agent_dir)
    fwd, right = DIRS[direction], DIRS[(direction + 1) % 4]
    top_left = pos + fwd * (size - 1) - right * (size // 2)
    corner = top_left + size * (right - fwd)
    xs = range(corner[0], top_left[0] + 1) if corner[0] < top_left[0] else range(top_left[0], corner[0])
    ys = range(corner[1], top_left[1] + 1) if corner[1] < top_left[1] else range(top_left[1], corner[1])

    objects: list[Seen] = []
    barriers: list[Seen] = []
    for j in range(size):
        for i in range(size):
            cell = top_left - fwd * j + right * i
            dist = int(abs(pos[0] - cell[0]) + abs(pos[1] - cell[1]))
            if cell[0] < 0 or cell[1] < 0 or dist == 0:
                continue
            kind = IDX_TO_OBJECT[int(image[i, j, 0])]
            color = IDX_TO_COLOR[int(image[i, j, 1])]
            where = (int(cell[0]), int(cell[1]))
            if kind in NAMED:
                state = f" {IDX_TO_STATE[int(image[i, j, 2])]}" if kind == "door" else ""
                objects.append(Seen(f"{color}{state} {kind}", where, dist))
            rel = cell - pos
            if kind in ("box", "wall") and int(np.cross(fwd, rel)) == 0:
                barriers.append(Seen(kind, where, int(np.dot(fwd, rel))))
    objects.sort(key=lambda o: o.dist)

    # ------------------------------------------------------------------------------------ description
    if objects:
        text = "In front of you in this room, you can see several objects: "
        counts: dict[str, int] = {}
        for o in objects:
            if "wall" in o.name:
                continue
            rel = np.array(o.pos) - pos
            front, side = int(np.dot(fwd, rel)), int(np.dot(right, rel))
            if side == 0:
                where = f"right in front of you {front} steps away. "
            elif side > 0:
                where = f"{front} steps in front of you and {side} steps to your right. "
            else:
                where = f"{front} steps in front of you and {-side} steps to your left. "
            counts[o.name] = counts.get(o.name, 0) + 1
            text += f"There is a {o.name} {counts[o.name]} {where} "
    else:
        text = "You cannot see any objects within sight."
    text += "The room has walls around you. "
    barriers.sort(key=lambda b: b.dist)
    if barriers:
        text += f"You are facing a {barriers[0].name} {barriers[0].dist} steps away. "
    carrying = u.carrying
    text += f"You are carrying a {carrying.color} {carrying.type}." if carrying else "You are not carrying anything."

    # ---------------------------------------------------------------------------------------- actions
    actions: dict[str, list[int]] = {"turn left": [LEFT], "turn right": [RIGHT]}
    errors: dict[str, str] = {}
    if not barriers or barriers[0].dist > 1:
        actions["move forward"] = [FORWARD]
    else:
        errors["move forward"] = "There is a barrier in front of you, you can't move forward."

    def path(target: tuple[int, int], arrive: bool) -> list[int] | None:
        return _shortest_path(tuple(pos), direction, target, objects, barriers, xs, ys, arrive)

    def numbered(verb: str, names: list[Seen], suffix: list[int], why: str) -> None:
        """``<verb> <name> <k>`` for the k-th reachable object of each name."""
        count: dict[str, int] = {}
        for o in names:
            steps = path(o.pos, arrive=False)
            k = count.get(o.name, 0) + 1
            if steps is None:
                errors[f"{verb} {o.name} {k}"] = f"You cannot {verb} {o.name} {k}, {why}"
            else:
                count[o.name] = k
                actions[f"{verb} {o.name} {k}"] = steps + suffix

    no_path = "as there is no path leading to it."
    if carrying is None:
        numbered("pickup", [o for o in objects if not any(w in o.name for w in ("wall", "door", "goal"))],
                 [PICKUP], no_path)
    if carrying is not None:
        ahead = tuple(int(v) for v in pos + fwd)
        if any(o.pos == ahead and _blocked(o.name) for o in objects):
            errors["drop"] = "You cannot drop the object, as there is already an object in front of you."
        else:
            actions["drop"] = [DROP]
    else:
        errors["drop"] = "You cannot drop the object, as you are not carrying anything."

    doors: dict[str, int] = {}
    for o in objects:
        if "door" not in o.name:
            continue
        doors[o.name] = k = doors.get(o.name, 0) + 1
        label = f"{o.name} {k}"
        if "open door" in o.name:
            steps = path(o.pos, arrive=True)
            if steps is None:
                errors[f"go through {label}"] = f"You cannot go through {label}, {no_path}"
            else:
                actions[f"go through {label}"] = steps
            continue
        if "locked door" in o.name:
            if carrying is None or carrying.type != "key":
                errors[f"toggle and go through {label}"] = (
                    f"You cannot toggle and go through {label}, as you are not carrying a key.")
                continue
            if carrying.color != o.name.split(" ")[0]:
                errors[f"toggle and go through {label}"] = (
                    f"You cannot toggle and go through {label}, as the color of the key you are carrying does not "
                    f"match the color of door.")
                continue
        steps = path(o.pos, arrive=False)
        if steps is None:
            errors[f"toggle and go through {label}"] = f"You cannot toggle and go through {label}, {no_path}"
        else:
            actions[f"toggle and go through {label}"] = steps + [TOGGLE, FORWARD]
            if not steps:
                actions["toggle"] = [TOGGLE]
        if "closed door" in o.name:
            errors[f"go through {label}"] = f"You cannot go through {label}, as it is closed. You should toggle it first."

    for o in objects:
        if "goal" in o.name:
            steps = path(o.pos, arrive=True)
            if steps is None:
                errors["go to goal"] = f"You cannot go to the goal, {no_path}"
            else:
                actions["go to goal"] = steps
    numbered("go to", [o for o in objects if "wall" not in o.name and "goal" not in o.name], [], no_path)
    actions["check available actions"] = []
    return text, actions, errors


def _shortest_path(start, direction, target, objects, barriers, xs, ys, arrive) -> list[int] | None:
    """Primitive actions (forward, left, right) from ``(start, direction)`` to stand on ``target`` (``arrive``) or to
    face it from the next cell, avoiding blocking objects and staying within the viewed square; None if none."""
    blocked = {o.pos for o in objects + barriers if _blocked(o.name)}
    frontier = deque([(start, direction)])
    came: dict = {(start, direction): None}
    while frontier:
        state = frontier.popleft()
        p, d = state
        vec = DIRS[d]
        if (arrive and p == target) or (not arrive and (target[0] - p[0], target[1] - p[1]) == (vec[0], vec[1])):
            steps = []
            while came[state] is not None:
                state, action = came[state]
                steps.append(action)
            return steps[::-1]
        for action in (FORWARD, LEFT, RIGHT):
            if action == FORWARD:
                nxt = ((p[0] + int(vec[0]), p[1] + int(vec[1])), d)
            else:
                nxt = (p, (d - 1) % 4 if action == LEFT else (d + 1) % 4)
            if nxt in came or nxt[0][0] not in xs or nxt[0][1] not in ys or nxt[0] in blocked:
                continue
            came[nxt] = (state, action)
            frontier.append(nxt)
    return None
