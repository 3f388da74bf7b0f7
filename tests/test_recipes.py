"""The recipe vocabulary: one name per FP8 recipe, its label, and the object TE builds."""

import pytest

from fp8lab import recipes
from fp8lab.e2e import worker
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


def test_chapter_09s_settings_build_tes_recipes():
    """Chapter 09's worker cells build every setting's recipe as TE ships it."""
    make = worker.load().make_recipe
    for name, setting in SETTINGS.items():
        if setting.family != "te":  # torchao's recipes live in its converted model
            continue
        made = make(reference_recipe, setting.recipe)
        assert (made is None) == (name == "bf16")
        if made is not None:
            assert type(made).__name__ == recipes.CLASSES[name]
    delayed = make(reference_recipe, "delayed")
    assert (delayed.amax_history_len, delayed.amax_compute_algo) == (1024, "max")
    assert SETTINGS["current"].label == "TE " + recipes.label("current")
