"""Continued pretraining at the new length: recipes, data packing, the accelerate loop, checkpoints."""

from .loop import train
from .recipe import Recipe, load_recipe, recipe_from_dict

__all__ = ["Recipe", "load_recipe", "recipe_from_dict", "train"]
