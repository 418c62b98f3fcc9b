"""What a run trains: ``full``; ``positions`` (position parameters, plus LayerNorms if asked); ``lora``
(peft LoRA on attention, with the position table and optionally the norms trainable, as LongLoRA does)."""

from __future__ import annotations

from torch import nn

from ..portable.posswap_architectures import find_sites


def enable_checkpointing(model: nn.Module) -> None:
    """Activation checkpointing on ``model`` (a transformers model): transformers 5.24 renamed it, and its old name
    warns; earlier 5.x releases have only the old one."""
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def _is_norm(name: str) -> bool:
    # GPT-2: ln_1, ln_2, ln_f; BERT family: LayerNorm.
    last = name.split(".")[-2] if name.endswith((".weight", ".bias")) else name
    return last.startswith("ln_") or last == "LayerNorm"


def position_parameter_names(model: nn.Module) -> set[str]:
    """The learned table, if kept, and every parameter of a bias provider (TUPE's table and projections, T5's
    buckets, ...): they all live under the base model's ``posswap_bias_providers``."""
    sites = find_sites(model)
    table = sites.table.weight if sites.table is not None else None
    return {name for name, p in model.named_parameters() if p is table or "posswap_bias_providers" in name}


def select_trainable(model: nn.Module, trainable: str, train_norms: bool, lora=None) -> nn.Module:
    """Set requires_grad (and wrap with peft for lora); returns the model to train."""
    if trainable == "full":
        model.requires_grad_(True)
        return model
    if trainable == "head":
        return _head_only(model)
    positions = position_parameter_names(model)
    if trainable == "positions":
        if not positions and not train_norms:
            raise ValueError(
                "trainable='positions' but this model has no position parameters (its method dropped the table, or, "
                "for sinusoidal, made it fixed). "
                "Set train.train_norms: true, or use trainable 'full' or 'lora'."
            )
        for name, parameter in model.named_parameters():
            parameter.requires_grad_(name in positions or (train_norms and _is_norm(name)))
        return model
    from peft import LoraConfig, get_peft_model

    arch = find_sites(model).arch
    config = LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(arch.lora_targets),
        fan_in_fan_out=arch.conv1d,
    )
    peft_model = get_peft_model(model, config)
    # peft freezes everything but LoRA; position table (and norms) train too.
    for name, parameter in model.named_parameters():
        if name in positions or (train_norms and _is_norm(name)):
            parameter.requires_grad_(True)
    return peft_model


def _head_only(model: nn.Module) -> nn.Module:
    """Train only what lies outside the base model (the LM head's transform and bias): an encoder shipped without
    an MLM head gets one while its own weights, and the word embeddings a tied decoder shares, stay as they are."""
    base = set(map(id, model.base_model.parameters()))
    head = [p for p in model.parameters() if id(p) not in base]
    if not head:
        raise ValueError(
            f"train.trainable: head, but {type(model).__name__} has no parameters outside its base model (a tied "
            "output layer is the word embeddings). Use trainable 'full', 'positions' or 'lora'."
        )
    model.requires_grad_(False)
    for parameter in head:
        parameter.requires_grad_(True)
    return model


def merged(model: nn.Module) -> nn.Module:
    """The plain transformers model to save: LoRA merged into the weights."""
    from peft import PeftModel

    return model.merge_and_unload() if isinstance(model, PeftModel) else model
