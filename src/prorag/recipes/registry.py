"""The recipes a ``methods`` entry may name: the built-in ones by name, or any :class:`~prorag.recipes.base.Recipe`
by dotted path (``recipe: my_package.recipes:MY_RECIPE``, :mod:`prorag.plugins`), with no edit under ``src/``."""

from __future__ import annotations

import difflib
import importlib
from typing import Final

from prorag.errors import UserError
from prorag.plugins import PluginError, is_plugin_path, load_plugin
from prorag.recipes.base import Recipe

# The built-in recipes, imported on first use: "module:attribute" of each Recipe.
_BUILTIN: Final[dict[str, str]] = {
    "sft_rl": "prorag.recipes.grpo:SFT_RL",
    "rl_from_sft": "prorag.recipes.grpo:RL_FROM_SFT",
    "rl_from_instruct": "prorag.recipes.grpo:RL_FROM_INSTRUCT",
    "mcts_dpo": "prorag.recipes.mcts_dpo:MCTS_DPO",
    "sft_mcts_dpo": "prorag.recipes.mcts_dpo:SFT_MCTS_DPO",
    "tearag": "prorag.recipes.tearag:TEARAG",
}


class UnknownRecipeError(UserError, ValueError):
    """A recipe that is neither built in nor a dotted path to a :class:`Recipe`."""


def recipe_names() -> list[str]:
    """The built-in recipes' names."""
    return sorted(_BUILTIN)


def get_recipe(name: str) -> Recipe:
    """The recipe ``name`` names: a built-in one, or the :class:`Recipe` a dotted path names."""
    target = _BUILTIN.get(name)
    if target is not None:
        module, attribute = target.split(":")
        return getattr(importlib.import_module(module), attribute)
    if is_plugin_path(name):
        found = load_plugin(name, "recipe")
        if not isinstance(found, Recipe):
            raise PluginError(f"recipe {name!r} names {found!r}, not a prorag.recipes.Recipe")
        return found
    close = difflib.get_close_matches(str(name), recipe_names(), n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownRecipeError(f"unknown recipe {name!r}{hint} (known: {', '.join(recipe_names())}, or a Recipe of "
                             "your own as 'package.module:RECIPE')")
