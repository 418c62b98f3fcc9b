"""What a patched model does at run time, rebuilt from the ``posswap`` block of its config.

:func:`install_positions` is the one entry point: ``posswap.patch`` calls it after changing weights, and the
classes of a saved model (``modeling_posswap.py``) call it in ``__init__``, before the weights load. So the
library and a folder loaded with ``trust_remote_code=True`` run the same code.

The methods' installers are registered by their own run-time modules (``posswap_<name>.py``, all imported by
``posswap_methods.py``) in ``posswap_registry.INSTALLERS``.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from torch import nn

from .posswap_architectures import Sites, find_stacks
from .posswap_block import checked_block, describe
from .posswap_files import install_atomic_save
from .posswap_guard import install_length_guard
from .posswap_positions import install_position_carrier
from .posswap_registry import INSTALLERS, KEEPS_TABLE, RUNTIME_CODE
from .posswap_state import install_call_state
from .posswap_tables import NoPositions


def drop_table(sites: Sites) -> None:
    if sites.table is not None:
        setattr(sites.owner, sites.arch.table, NoPositions(sites.table_dim))


def needs_runtime_code(block: dict) -> bool:
    """Whether a model patched as ``block`` says runs code of posswap's, so that its saved folder must carry it
    (``modeling_posswap.py``): every method but those whose installer says otherwise for this block (a plain
    ``interpolate`` only resized the table: plain transformers rebuilds it exactly). NoPE too: plain transformers
    would load its folder with a random table."""
    method = block.get("method")
    runtime_code = RUNTIME_CODE.get(method)
    return method in INSTALLERS and (runtime_code is None or runtime_code(block))


def install_positions(model: nn.Module, block: dict, stacks: list[Sites] | None = None) -> None:
    """Make ``model`` run as ``block`` says: drop the table if asked, hook the method in, guard the length, and
    make its ``save_pretrained`` atomic. The block is checked first (a hand-edited config.json is named, not a
    KeyError from an installer; once: a block checked on the way here is not checked again). Idempotent. Builds no
    tensors, so it also works on the meta device. ``stacks``: the model's, where the caller (``patch``) has them
    (BART's encoder and decoder each get the method)."""
    block = model.config.posswap = checked_block(block, describe(model.config), model.config)
    for sites in stacks or find_stacks(model):
        _install_stack(model, block, sites)
    install_atomic_save(model)


def _install_stack(model: nn.Module, block: dict, sites: Sites) -> None:
    if block["method"] not in KEEPS_TABLE and block.get("absolute", "drop") == "drop":
        drop_table(sites)
    INSTALLERS[block["method"]](model, sites, block)
    if needs_runtime_code(block):
        # Its hook also marks a call that came through the hooks: see posswap_state.forward_through_hooks.
        install_call_state(sites.base)
        if not sites.arch.passes_position_ids and not sites.arch.own_attention:  # no posswap kernel to carry them to
            install_position_carrier(sites.base, sites.self_attentions())
    install_length_guard(sites.base, sites.offset)
