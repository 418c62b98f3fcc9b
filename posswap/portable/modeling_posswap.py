"""The classes of a saved posswap model: what ``AutoModelFor<Head>.from_pretrained(folder, trust_remote_code=True)``
runs where posswap is not installed, and what ``posswap.from_pretrained`` builds where it is.

One config class per architecture (``PosswapGPT2Config`` subclasses ``GPT2Config``) and one model class per
head (``PosswapGPT2LMHeadModel`` subclasses ``GPT2LMHeadModel``). The model classes install the method from
the config's ``posswap`` block in ``__init__``, before the weights load, so a dropped table is never reported
missing. In memory the config keeps its stock ``model_type`` (peft and transformers key on it); in
config.json it is ``posswap-<type>`` with an ``auto_map``, so plain transformers refuses the folder without
``trust_remote_code`` instead of loading a model without its positions. ``save_pretrained`` copies this file
and the files it imports beside the weights (transformers' ``custom_object_save``).

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import json

import transformers
from transformers.models.auto import modeling_auto
from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES, model_type_to_module_name

from .posswap_architectures import ARCHITECTURES
from .posswap_block import checked_block, describe, weights_mismatch
from .posswap_carry import carry_method
from .posswap_runtime import install_positions, needs_runtime_code
from .posswap_state import forward_through_hooks

MODEL_TYPE_PREFIX = "posswap-"
_MODULE = __name__.rsplit(".", 1)[-1]  # "modeling_posswap", in posswap and in a downloaded folder alike
# Auto classes a saved folder answers to, with transformers' table of the stock head for each model type.
AUTO_HEADS = {
    "AutoModel": modeling_auto.MODEL_MAPPING_NAMES,
    "AutoModelForCausalLM": modeling_auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
    "AutoModelForMaskedLM": modeling_auto.MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    "AutoModelForPreTraining": modeling_auto.MODEL_FOR_PRETRAINING_MAPPING_NAMES,
    "AutoModelForSequenceClassification": modeling_auto.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForTokenClassification": modeling_auto.MODEL_FOR_TOKEN_CLASSIFICATION_MAPPING_NAMES,
    "AutoModelForQuestionAnswering": modeling_auto.MODEL_FOR_QUESTION_ANSWERING_MAPPING_NAMES,
    "AutoModelForMultipleChoice": modeling_auto.MODEL_FOR_MULTIPLE_CHOICE_MAPPING_NAMES,
    "AutoModelForSeq2SeqLM": modeling_auto.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES,
}


class PosswapConfigMixin:
    """config.json says ``posswap-<type>`` and maps every Auto class to this file; in memory nothing changes."""

    _auto_class = "AutoConfig"  # save_pretrained copies this file (and its relative imports) beside config.json

    def to_json_string(self, use_diff: bool = True) -> str:
        data = json.loads(super().to_json_string(use_diff))
        model_type = type(self).model_type
        data["model_type"] = MODEL_TYPE_PREFIX + model_type
        data["architectures"] = [posswap_name(name) for name in data.get("architectures") or []]
        data["auto_map"] = {"AutoConfig": f"{_MODULE}.{type(self).__name__}"} | {
            auto: f"{_MODULE}.{posswap_name(table[model_type])}"
            for auto, table in AUTO_HEADS.items()
            if model_type in table
        }
        return json.dumps(data, indent=2, sort_keys=True) + "\n"

    def save_pretrained(self, save_directory, *args, **kwargs):
        """transformers' own (which copies this file and its imports), then the run-time module of a method
        registered outside posswap, which those imports do not reach (posswap_carry)."""
        super().save_pretrained(save_directory, *args, **kwargs)
        carry_method(getattr(self, "posswap", None), save_directory)

    @classmethod
    def get_config_dict(cls, *args, **kwargs):  # from_pretrained's model_type check reads this
        config_dict, kwargs = super().get_config_dict(*args, **kwargs)
        return cls._stock_model_type(config_dict), kwargs

    @classmethod
    def from_dict(cls, config_dict: dict, **kwargs):  # AutoConfig's local path comes here directly
        return super().from_dict(cls._stock_model_type(config_dict), **kwargs)

    @classmethod
    def _stock_model_type(cls, config_dict: dict) -> dict:
        if config_dict.get("model_type") == MODEL_TYPE_PREFIX + cls.model_type:
            config_dict = {**config_dict, "model_type": cls.model_type}
        return config_dict


class PosswapModelMixin:
    """Installs the method recorded in ``config.posswap`` right after the stock model is built."""

    def __init__(self, config, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        # A method this code does not know is named (not "a plain interpolate"); old keys are renamed first. Checked
        # once: install_positions and a loader that checked it already do not check it again.
        block = config.posswap = checked_block(getattr(config, "posswap", None), describe(config), config)
        if not isinstance(block, dict) or not needs_runtime_code(block):
            raise ValueError(
                f"{type(self).__name__} needs a config with a posswap block of a method that runs code of posswap's "
                "(a plain interpolate loads with the stock class)."
            )
        install_positions(self, block)

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path, *args, **kwargs):
        """transformers' own, with a size mismatch between the posswap block and the weights (an edited num_buckets)
        named in one line instead of its generic ``ignore_mismatched_sizes`` error."""
        try:
            return super().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        except RuntimeError as error:
            if "ignore_mismatched_sizes" not in str(error) or kwargs.get("ignore_mismatched_sizes"):
                raise
            message = weights_mismatch(cls, pretrained_model_name_or_path, kwargs)
            if message is None:
                raise
            raise ValueError(message) from None


def posswap_name(class_name: str) -> str:
    return class_name if class_name.startswith("Posswap") else "Posswap" + class_name


def _stock_heads(model_type: str) -> list[type]:
    """Every model class transformers defines for ``model_type`` (GPT2Model, GPT2LMHeadModel, ...)."""
    module = getattr(transformers.models, model_type_to_module_name(model_type))
    modeling = getattr(module, f"modeling_{model_type_to_module_name(model_type)}")
    classes = [getattr(modeling, name) for name in modeling.__all__]
    return [
        c
        for c in classes
        # Not the abstract base, nor a deprecated alias (PretrainedBartModel warns when subclassed)
        if issubclass(c, transformers.PreTrainedModel) and "pretrained" not in c.__name__.lower()
    ]


def _define(name: str, bases: tuple, attributes: dict | None = None) -> type:
    cls = type(name, bases, {"__module__": __name__, "__qualname__": name, **(attributes or {})})
    globals()[name] = cls  # found by name: auto_map says "modeling_posswap.<name>"
    return cls


CONFIG_CLASSES: dict[str, type] = {}  # stock model_type -> Posswap config class
MODEL_CLASSES: dict[str, type] = {}  # stock class name -> Posswap model class
for _model_type in ARCHITECTURES:
    _stock_config = getattr(transformers, CONFIG_MAPPING_NAMES[_model_type])
    _config = CONFIG_CLASSES[_model_type] = _define(
        posswap_name(_stock_config.__name__), (PosswapConfigMixin, _stock_config)
    )
    for _stock in _stock_heads(_model_type):
        MODEL_CLASSES[_stock.__name__] = _define(
            posswap_name(_stock.__name__),
            (PosswapModelMixin, _stock),
            {"config_class": _config, "forward": forward_through_hooks(_stock.forward)},
        )
