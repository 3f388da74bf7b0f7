"""The recipe vocabulary: one name per FP8 recipe, its label, and the object TE builds."""

import pytest

from fp8lab import recipes
from fp8lab.e2e.build import fp8_recipe
from fp8lab.e2e.settings import SETTINGS
from fp8lab.reference import recipe as reference_recipe


@pytest.mark.parametrize("name", [n for n in recipes.NAMES if n != "bf16"])
def test_every_fp8_name_builds_its_class(name):
    made = recipes.make(reference_recipe, name)
    assert type(made).__name__ == recipes.CLASSES[name]


def test_overrides_reach_the_recipe_and_bf16_has_none():
    made = recipes.make(reference_recipe, "delayed", amax_history_len=16)
    assert made.amax_history_len == 16
    assert recipes.make(reference_recipe, "bf16") is None
    with pytest.raises(ValueError, match="overrides"):
        recipes.make(reference_recipe, "bf16", amax_history_len=16)


def test_labels_and_bad_names():
    assert recipes.label("delayed") == "FP8 delayed" and recipes.label("bf16") == "BF16"
    assert set(recipes.LABELS) == set(recipes.NAMES) == {"bf16", *recipes.CLASSES}
    with pytest.raises(ValueError, match="name"):
        recipes.make(reference_recipe, "fp8-current")  # a memory precision, not a recipe name
    with pytest.raises(TypeError, match="recipe_module"):
        recipes.make(object(), "current")  # te itself, say, instead of its recipe module


def test_chapter_09s_settings_build_through_the_vocabulary():
    calibrated = fp8_recipe(reference_recipe, SETTINGS["te-delayed-calibrated"])
    assert (calibrated.amax_history_len, calibrated.amax_compute_algo) == (16, "most_recent")
    assert type(fp8_recipe(reference_recipe, SETTINGS["te-current"])).__name__ == (
        "Float8CurrentScaling"
    )
    assert fp8_recipe(reference_recipe, SETTINGS["bf16"]) is None
    assert SETTINGS["te-current"].label == "TE " + recipes.label("current")
