"""Recipes: how a method trains, as a registered composition of stages (:mod:`prorag.recipes.base`); the
compositions themselves import Kedro and the stage pipelines (:mod:`prorag.recipes.stages`), only when a recipe is
looked up."""

from prorag.recipes.base import Recipe
from prorag.recipes.registry import UnknownRecipeError, get_recipe, recipe_names

__all__ = ["Recipe", "UnknownRecipeError", "get_recipe", "recipe_names"]
