"""Arguments of the public API (issue 60): a flag that is not True or False is refused in one line naming it, before
anything changes ("no" is a true string: ``allow_shrink="no"`` shrank the table); posswap's own methods cannot be
unregistered, and a folder of a method this process does not have registered is not called damaged; bad arguments
to ``register_method`` are one line naming the argument, not an AttributeError from inside it.
"""

from __future__ import annotations

import dataclasses
import inspect
import json

import pytest
import torch
import transformers
from conftest import make_model, outputs, snapshot, token_ids
from test_reliability_registry import registries

import posswap
from posswap.portable import posswap_registry
from posswap.registry import METHODS, register_method, unregister_method
from posswap.training import recipe_from_dict

# -- flags: True or False, nothing else ------------------------------------------------------------------------


def gpt2_of(positions: int) -> transformers.GPT2LMHeadModel:
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=99, n_positions=positions)
    return transformers.GPT2LMHeadModel(config).eval()


@pytest.mark.parametrize("allow_shrink", ["no", "False", 0, None])
def test_patch_refuses_an_allow_shrink_that_is_not_a_bool_and_leaves_the_model_as_it_was(allow_shrink):
    model = gpt2_of(128)
    state, config, hooks = snapshot(model)
    with pytest.raises(ValueError) as error:
        posswap.patch(model, posswap.InterpolateConfig(max_length=64, mode="copy"), allow_shrink=allow_shrink)
    assert str(error.value) == f"allow_shrink must be True or False, got {allow_shrink!r}."
    assert model.transformer.wpe.weight.shape[0] == 128 and model.config.n_positions == 128
    assert model.state_dict().keys() == state.keys()
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state.items())
    assert model.config.to_dict() == config and dict(model._forward_pre_hooks) == hooks
    assert not hasattr(model.config, "posswap")


def test_evaluate_refuses_a_progress_that_is_not_a_bool_before_scoring(monkeypatch):
    from posswap.evaluation import harness

    scored = []
    monkeypatch.setattr(harness, "_score_model", lambda *args, **kwargs: scored.append(args))
    tokenizer = transformers.AutoTokenizer.from_pretrained(posswap.data.GPT2_TOKENIZER_DIR)
    with pytest.raises(ValueError) as error:
        posswap.evaluate({"m": gpt2_of(64)}, tokenizer, [16], ["a few words " * 200], max_tokens=16, progress="no")
    assert str(error.value) == "progress must be True or False, got 'no'."
    assert scored == []


def test_push_to_hub_refuses_a_private_that_is_not_a_bool_before_any_request(hub, tmp_path):
    model = posswap.patch(gpt2_of(32), posswap.RopeConfig(max_length=64))
    model.save_pretrained(tmp_path / "out")
    with pytest.raises(ValueError) as error:
        posswap.push_to_hub(tmp_path / "out", "me/gpt2-rope", private="no")  # "no" would make a private repo
    assert str(error.value) == "private must be True or False, got 'no'."
    assert hub.repos == {}


@pytest.mark.parametrize("flag", ["resume", "overwrite", "force"])
def test_train_refuses_a_flag_that_is_not_a_bool_before_it_reads_or_writes_anything(tmp_path, flag):
    recipe = recipe_from_dict(
        {
            "model": str(tmp_path / "no-model-here"),  # today's code gets this far, and says the folder is missing
            "posswap": {"method": "rope", "max_length": 64},
            "train": {"output_dir": str(tmp_path / "run")},
        }
    )
    with pytest.raises(ValueError) as error:
        posswap.train(recipe, **{flag: "no"})
    assert str(error.value) == f"{flag} must be True or False, got 'no'."
    assert sorted(p.name for p in tmp_path.iterdir()) == []


FLAG_TYPES = ("bool", "bool | None", bool)  # annotations as written (most modules: from __future__ import annotations)


def test_every_flag_of_the_public_functions_and_configs_refuses_a_string():
    """Found, not listed: a function of ``posswap.__all__`` that gains a flag is checked here too. The check comes
    first, so the other arguments may be anything."""
    checked = []
    for name in posswap.__all__:
        value = getattr(posswap, name)
        if isinstance(value, type) and issubclass(value, posswap.PositionConfig):
            flags = [f.name for f in dataclasses.fields(value) if f.type in FLAG_TYPES]
            call = lambda flag, value=value: value(max_length=64, **{flag: "no"})  # noqa: E731
        elif inspect.isfunction(value):
            parameters = inspect.signature(value).parameters.values()
            flags = [p.name for p in parameters if p.annotation in FLAG_TYPES]
            required = [p.name for p in parameters if p.default is p.empty and p.kind is p.POSITIONAL_OR_KEYWORD]
            call = lambda flag, value=value, required=required: value(  # noqa: E731
                **dict.fromkeys(required, object()), **{flag: "no"}
            )
        else:
            continue
        for flag in flags:
            with pytest.raises(ValueError) as error:
                call(flag)
            said = str(error.value)
            assert said.startswith(f"{flag} must be ") and "\n" not in said and "got 'no'" in said, (name, said)
            checked.append(f"{name}.{flag}")
    assert {"patch.allow_shrink", "evaluate.progress", "push_to_hub.private", "train.resume"} <= set(checked)
    assert {"InterpolateConfig.exact_short_inputs", "AlibiConfig.symmetric", "TupeConfig.relative"} <= set(checked)


# -- posswap's own methods stay registered; a folder is not blamed for the process ---------------------------


@pytest.fixture
def registry_restored():
    """Every registry table put back afterwards: code that removes a built-in method must not leave the other
    tests of this process without it."""
    tables = [METHODS, *(getattr(posswap_registry, n) for n in ("INSTALLERS", "RUNTIME_CODE", "SCHEMAS", "CARRIED"))]
    tables += [posswap_registry.KEEPS_TABLE, posswap_registry.BLOCK_CHECKS]
    saved = [(table, table.copy()) for table in tables]
    yield
    for table, before in saved:
        table.clear()
        table.update(before)


@pytest.mark.parametrize("name", ["alibi", "rope", "interpolate"])
def test_unregistering_a_built_in_method_is_refused_and_it_still_patches(registry_restored, name):
    before = registries()
    with pytest.raises(ValueError) as error:
        unregister_method(name)
    assert str(error.value) == (
        f"Method {name!r} is one of posswap's own and cannot be unregistered; only methods registered with "
        "register_method can be removed."
    )
    assert registries() == before
    model = make_model("gpt2", "GPT2LMHeadModel")
    posswap.patch(model, METHODS[name].example(64))
    assert model.config.posswap["method"] == name


def test_a_folder_whose_method_is_not_registered_here_says_so_and_not_that_it_is_damaged(tmp_path, monkeypatch):
    model = posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), posswap.AlibiConfig(max_length=64))
    ids = token_ids(48)
    expected = outputs(model, ids)
    model.save_pretrained(tmp_path)
    saved = (tmp_path / "config.json").read_bytes()
    # This process without ALiBi (as unregister_method("alibi") left it before it was refused); put back afterwards.
    monkeypatch.delitem(METHODS, "alibi")
    monkeypatch.delitem(posswap_registry.INSTALLERS, "alibi")
    with pytest.raises(ValueError) as error:
        posswap.from_pretrained(str(tmp_path))
    said = str(error.value)
    assert said == (
        f"{tmp_path}: the model was patched with method 'alibi', which is not registered in this Python process; "
        "register it (posswap.registry.register_method) or load the folder in a new process."
    )
    assert "Put back" not in said and (tmp_path / "config.json").read_bytes() == saved
    assert json.loads(saved)["posswap"]["method"] == "alibi"
    monkeypatch.undo()  # registered again: the same folder loads, and gives the logits it was saved with
    assert torch.equal(outputs(posswap.from_pretrained(str(tmp_path)).eval(), ids), expected)


# -- register_method: bad arguments named ----------------------------------------------------------------------


@dataclasses.dataclass
class GoodConfig(posswap.PositionConfig):
    method = "arguments-check"


class NotADataclass(posswap.PositionConfig):  # its option would be a class attribute, not a field
    method = "arguments-check"
    factor: float = 0.5


def nothing(*args):
    return None


@pytest.mark.parametrize(
    "args,kwargs,error,said",
    [
        (
            (dict, None, None),
            {"variants": {}},
            TypeError,
            "config_class must be a dataclass subclass of posswap.PositionConfig; got dict.",
        ),
        (
            (GoodConfig(max_length=8), nothing, nothing),
            {"variants": {"v": {}}},
            TypeError,
            "config_class must be a dataclass subclass of posswap.PositionConfig; got an instance of GoodConfig.",
        ),
        (
            (posswap.PositionConfig, nothing, nothing),
            {"variants": {"v": {}}},
            ValueError,
            "config_class PositionConfig must name its method (a class attribute method = 'my-method'); got ''.",
        ),
        (
            (GoodConfig, None, nothing),
            {"variants": {"v": {}}},
            TypeError,
            "check must be a function check(model, sites, config); got None.",
        ),
        (
            (GoodConfig, nothing, "apply"),
            {"variants": {"v": {}}},
            TypeError,
            "apply must be a function apply(model, sites, config); got str.",
        ),
        (
            (GoodConfig, nothing, nothing, 3),
            {"variants": {"v": {}}},
            TypeError,
            "initialize must be a function initialize(model, sites, config, applied) or None; got int.",
        ),
        (
            (GoodConfig, nothing, nothing),
            {"variants": ["v"]},
            TypeError,
            "variants must be a dict of study variant name -> dict of config keys; got ['v'].",
        ),
        (
            (GoodConfig, nothing, nothing),
            {"variants": {"v": {}}, "extends_table": "no"},
            ValueError,
            "extends_table must be True or False, got 'no'.",
        ),
        (
            (GoodConfig, nothing, nothing),
            {"variants": {"v": {}}, "example": 5},
            TypeError,
            "example must be a function example(max_length) or None; got int.",
        ),
    ],
)
def test_register_method_names_a_bad_argument_and_registers_nothing(registry_restored, args, kwargs, error, said):
    before = registries()
    with pytest.raises(error) as raised:
        register_method(*args, **kwargs)
    assert str(raised.value) == said
    assert registries() == before and "arguments-check" not in METHODS


def test_register_method_refuses_a_config_class_that_is_not_a_dataclass(registry_restored):
    with pytest.raises(TypeError) as raised:
        register_method(NotADataclass, nothing, nothing, variants={"v": {}})
    assert str(raised.value) == (
        "config_class must be a dataclass subclass of posswap.PositionConfig; got NotADataclass, whose options factor "
        "are not dataclass fields (decorate it with @dataclass)."
    )
