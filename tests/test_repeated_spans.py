"""data.repeat_fraction: a share of the training windows carries a copy of one of its spans further on, the
same copy on every run; a span too long for the window is refused before anything is written."""

from __future__ import annotations

import datasets
import pytest

from posswap.training import recipe_from_dict, train
from posswap.training.data import with_repeated_spans
from posswap.training.recipe import recipe_differences

LENGTH, SPAN = 40, 8


def windows(count: int = 200) -> datasets.Dataset:
    # Distinct ids everywhere, so any repeated run of ids is a copy the function made.
    return datasets.Dataset.from_dict({"input_ids": [list(range(i * LENGTH, (i + 1) * LENGTH)) for i in range(count)]})


def copies(original: list[int], changed: list[int]) -> tuple[int, int] | None:
    """(source, target) of the one span copied within the window, or None when it is unchanged."""
    edited = [i for i, (a, b) in enumerate(zip(original, changed)) if a != b]
    if not edited:
        return None
    target = edited[0]
    assert edited == list(range(target, target + SPAN)), "one run of SPAN tokens is written"
    source = changed[target] - original[0]
    assert changed[target : target + SPAN] == original[source : source + SPAN], "the run is a span of the window"
    return source, target


def test_a_share_of_windows_gets_one_span_copied_further_on():
    before = windows()
    after = with_repeated_spans(before, fraction=0.5, span=SPAN, seed=3)
    found = [copies(a, b) for a, b in zip(before["input_ids"], after["input_ids"])]
    placed = [pair for pair in found if pair is not None]
    assert 70 <= len(placed) <= 130  # binomial(200, 0.5): mean 100, sd 7
    assert all(target >= source + SPAN and target + SPAN <= LENGTH for source, target in placed)
    distances = [target - source - SPAN for source, target in placed]
    assert min(distances) < 4 and max(distances) > LENGTH - 2 * SPAN - 8  # drawn across what fits


def test_copies_are_the_same_for_a_seed_and_differ_across_seeds():
    first = with_repeated_spans(windows(), 1.0, SPAN, seed=3)["input_ids"]
    assert with_repeated_spans(windows(), 1.0, SPAN, seed=3)["input_ids"] == first
    assert with_repeated_spans(windows(), 1.0, SPAN, seed=4)["input_ids"] != first
    assert with_repeated_spans(windows(), 0.0, SPAN, seed=3)["input_ids"] == windows()["input_ids"]


def recipe(bases, out, posswap, **data) -> dict:
    return {
        "model": str(bases / "gpt2"),
        "posswap": posswap,
        "data": {"train": str(bases / "text.txt"), **data},
        "train": {"output_dir": str(out), "max_steps": 2, "batch_size": 2, "save_every": 10},
    }


@pytest.mark.parametrize(
    "data,message",
    [
        ({"repeat_fraction": 1.5}, "data.repeat_fraction must be a number >= 0 and <= 1"),
        ({"repeat_fraction": 0.5, "repeat_span": 0}, "data.repeat_span must be a positive integer"),
        (
            {"repeat_fraction": 0.5, "repeat_span": 40},
            r"data.repeat_span \(40\) must be at most half the training window \(64",
        ),
    ],
)
def test_bad_repeat_settings_are_refused(bases, tmp_path, data, message):
    with pytest.raises(ValueError, match=message):
        recipe_from_dict(recipe(bases, tmp_path / "run", {"method": "rope", "max_length": 64}, **data))


def test_span_too_long_for_the_models_own_length_writes_nothing(bases, tmp_path):
    # posswap: null trains at the model's own length (32 here), known only once the model is loaded.
    raw = recipe(bases, tmp_path / "run", None, repeat_fraction=0.5, repeat_span=20)
    with pytest.raises(ValueError, match=r"data.repeat_span \(20\) must be at most half the training window \(32"):
        train(recipe_from_dict(raw), raw)
    assert not (tmp_path / "run").exists()


def test_keys_added_since_a_run_count_as_their_defaults_on_resume(bases, tmp_path):
    new = recipe_from_dict(recipe(bases, tmp_path / "run", {"method": "rope", "max_length": 64})).to_dict()
    old = {**new, "data": {k: v for k, v in new["data"].items() if not k.startswith("repeat_")}}
    assert recipe_differences(old, new) == []
    changed = {**new, "data": {**new["data"], "repeat_fraction": 0.5}}
    assert recipe_differences(old, changed) == ["data.repeat_fraction (0.0 -> 0.5)"]
