"""What a patched model does at run time, rebuilt from the ``posswap`` block of its config.

:func:`install_positions` is the one entry point: ``posswap.patch`` calls it after changing weights, and the
classes of a saved model (``modeling_posswap.py``) call it in ``__init__``, before the weights load. So the
library and a folder loaded with ``trust_remote_code=True`` run the same code.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

from torch import nn

from .posswap_alibi import AlibiBias
from .posswap_architectures import Sites, find_sites
from .posswap_attention import PLAIN_IMPLEMENTATIONS, install_bias
from .posswap_block import check_block, describe, migrate_block
from .posswap_files import install_atomic_save
from .posswap_guard import install_length_guard
from .posswap_placement import install_short_input_positions
from .posswap_rotary import install_rotary
from .posswap_state import install_call_state
from .posswap_t5 import T5Buckets
from .posswap_tables import NoPositions, SinusoidalPositions
from .posswap_tupe import TupeBias


def drop_table(sites: Sites) -> None:
    if sites.table is not None:
        setattr(sites.owner, sites.arch.table, NoPositions(sites.table_dim))


def _install_interpolate(model: nn.Module, sites: Sites, block: dict) -> None:
    """The resized table is a weight; only E5-Base-4k's placement of short inputs runs at run time."""
    if block.get("exact_short_inputs"):
        install_short_input_positions(sites.base, sites.offset)


def _install_rope(model: nn.Module, sites: Sites, block: dict) -> None:
    install_rotary(sites.base, sites.self_attentions(), sites.arch.qk_projections, block)
    if block.get("backend"):
        model.set_attn_implementation(PLAIN_IMPLEMENTATIONS[block["backend"]])


def _install_alibi(model: nn.Module, sites: Sites, block: dict) -> None:
    symmetric = block.get("symmetric")
    symmetric = (not sites.arch.causal) if symmetric is None else symmetric
    provider = AlibiBias(model.config.num_attention_heads, symmetric)
    install_bias(model, sites.base, sites.self_attentions(), [provider], block.get("backend") or "sdpa", sites.offset)


def _install_sinusoidal(model: nn.Module, sites: Sites, block: dict) -> None:
    dim, rows = sites.table_dim, model.config.max_position_embeddings
    like = sites.base.get_input_embeddings().weight  # the dtype and device the rows are returned in
    table = SinusoidalPositions(dim, rows, sites.offset, float(block["theta"]), float(block["scale"]), like)
    setattr(sites.owner, sites.arch.table, table)


def _install_nope(model: nn.Module, sites: Sites, block: dict) -> None:
    """NoPE: no positions at all. install_positions has already dropped the table; there is nothing to add."""


def _install_t5_bias(model: nn.Module, sites: Sites, block: dict) -> None:
    # Built with whatever values nn.Embedding starts with: the checkpoint (loading) or init (patching) sets them.
    attentions = sites.self_attentions()
    count = len(attentions) if block.get("per_layer") else 1
    providers = [
        T5Buckets(model.config.num_attention_heads, block["num_buckets"], block["max_distance"], not sites.arch.causal)
        for _ in range(count)
    ]
    install_bias(model, sites.base, attentions, providers, block.get("backend") or "sdpa", sites.offset)


def _install_tupe(model: nn.Module, sites: Sites, block: dict) -> None:
    config, heads = model.config, model.config.num_attention_heads
    # TUPE-R: T5's buckets as the paper uses them (32 buckets, max distance 128), causal for decoders.
    relative = T5Buckets(heads, 32, 128, bidirectional=not sites.arch.causal) if block.get("relative") else None
    table_dim = sites.table_dim  # NoPositions keeps the dropped table's width
    provider = TupeBias(
        heads, table_dim, config.hidden_size, block["max_length"], sites.offset, block["cls_reset"], relative
    )
    install_bias(model, sites.base, sites.self_attentions(), [provider], block.get("backend") or "sdpa", sites.offset)


INSTALLERS = {
    "interpolate": _install_interpolate,
    "rope": _install_rope,
    "alibi": _install_alibi,
    "sinusoidal": _install_sinusoidal,
    "nope": _install_nope,
    "t5-bias": _install_t5_bias,
    "tupe": _install_tupe,
}
# Methods that keep the learned table (the others drop it unless their block says absolute: keep).
KEEPS_TABLE = ("interpolate",)


def needs_runtime_code(block: dict) -> bool:
    """Whether a model patched as ``block`` says runs code of posswap's, so that its saved folder must carry it
    (``modeling_posswap.py``): every method but a plain ``interpolate``, which only resized the table (plain
    transformers rebuilds it exactly). NoPE too: plain transformers would load its folder with a random table."""
    if block.get("method") == "interpolate":
        return bool(block.get("exact_short_inputs"))
    return block.get("method") in INSTALLERS


def install_positions(model: nn.Module, block: dict) -> None:
    """Make ``model`` run as ``block`` says: drop the table if asked, hook the method in, guard the length, and
    make its ``save_pretrained`` atomic. The block is checked first (a hand-edited config.json is named, not a
    KeyError from an installer). Idempotent. Builds no tensors, so it also works on the meta device."""
    migrated = migrate_block(block)  # a folder saved by an older posswap: its keys under their current names
    if migrated is not block:
        block = model.config.posswap = migrated
    check_block(block, describe(model.config), model.config)
    sites = find_sites(model)
    if block["method"] not in KEEPS_TABLE and block.get("absolute", "drop") == "drop":
        drop_table(sites)
    INSTALLERS[block["method"]](model, sites, block)
    if needs_runtime_code(block):
        # Its hook also marks a call that came through the hooks: see posswap_state.forward_through_hooks.
        install_call_state(sites.base)
    install_length_guard(sites.base, sites.offset)
    install_atomic_save(model)
