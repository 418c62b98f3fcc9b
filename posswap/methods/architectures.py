"""Patch-time readings of a model's architecture (first-layer q/k weights, ELECTRA's projection) that run time
never needs. The per-architecture facts themselves live in ``portable/posswap_architectures.py``, because saved
models carry them; posswap imports them from there (one rule: portable names come from ``posswap.portable``)."""

import torch
from torch import nn

from ..portable.posswap_architectures import ARCHITECTURES, NOT_YET, Architecture, Sites, padding_offset
from ..registry import registered
from .backends import installs_attention


def first_layer_qk(sites: Sites) -> tuple[torch.Tensor, torch.Tensor]:
    """W_Q and W_K of the first self-attention as (in, hidden) matrices, detached (GPT-2's fused c_attn is a
    Conv1D stored (in, out); BERT's query / key are Linear (out, in))."""
    attention, hidden = sites.self_attentions()[0], sites.config.hidden_size
    matrices = []
    for name, chunks in sites.arch.qk_projections:
        weight = getattr(attention, name).weight.detach()
        weight = weight if sites.arch.conv1d else weight.t()
        matrices += [weight[:, c * hidden : (c + 1) * hidden] for c in chunks]
    w_q, w_k = matrices
    return w_q, w_k


def first_layer_qk_biases(sites: Sites) -> tuple[torch.Tensor, torch.Tensor]:
    """b_Q and b_K of the first self-attention, (hidden,) views of the parameters (write under no_grad)."""
    attention, hidden = sites.self_attentions()[0], sites.config.hidden_size
    biases = []
    for name, chunks in sites.arch.qk_projections:
        bias = getattr(attention, name).bias
        biases += [bias.data[c * hidden : (c + 1) * hidden] for c in chunks]
    b_q, b_k = biases
    return b_q, b_k


def embedding_projection(sites: Sites) -> nn.Linear | None:
    """The map from the embeddings to the first layer's width, where the model has one (ELECTRA whose
    embedding size differs from its hidden size; ALBERT's encoder.embedding_hidden_mapping_in)."""
    path = sites.arch.embedding_projection
    if not path:
        return None
    try:
        return sites.base.get_submodule(path)
    except AttributeError:  # ELECTRA without one: embedding size = hidden size
        return None


def families_table() -> str:
    """The supported families as a markdown table, then the families refused and why: read from
    ``ARCHITECTURES`` and ``NOT_YET``, so a new entry is in the docs (``<!-- posswap:families -->``) and the README
    (``python -m posswap.cli.generate --write``) without editing either."""
    rows = ["| `model_type` | classes | kind | rows before position 0 | `posswap export` (RoPE) | notes |"]
    rows.append("|---|---|---|---|---|---|")
    for name, arch in sorted(ARCHITECTURES.items()):
        offset = "`pad_token_id + 1`" if arch.offset is padding_offset else "0"
        offset = f"{arch.inner_offset}, added by the table itself" if arch.inner_offset else offset
        kind = "encoder-decoder" if arch.encoder_decoder else "decoder" if arch.causal else "encoder"
        native = {"roformer": "RoFormer", "gpt_neox": "GPT-NeoX"}.get(arch.native_export, "refused: no exact native")
        native = "- (no `rope`)" if arch.own_attention else native
        rows.append(
            f"| `{name}` | `{arch.class_prefix}*` | {kind} | {offset} | {native} | {'; '.join(_notes(arch)) or '-'} |"
        )
    refused = "".join(f"\n- `{name}`: {why}." for name, why in NOT_YET.items())
    refused = f" Refused in one line, for now:\n{refused}" if refused else ""
    return (
        "\n".join(rows)
        + "\n\nEvery method runs on every family above, with any head, except those its notes refuse."
        + refused
    )


def _notes(arch: Architecture) -> list[str]:
    notes = [f"the length is `config.{arch.size_name}`"] if arch.size_name != "max_position_embeddings" else []
    if arch.embedding_projection:
        notes.append("embeddings projected to the layers' width: fitted inits read through the projection")
    if arch.own_attention:
        attention = [
            f"`{name}`" for name, spec in sorted(registered().items()) if installs_attention(spec.config_class)
        ]
        notes.append(f"{', '.join(attention)} refused: {arch.own_attention}; use `interpolate`")
    elif not arch.passes_position_ids:
        notes.append("posswap carries `position_ids` to the attention, which the model does not")
    if arch.note:
        notes.append(arch.note)
    return notes


def families_sentence() -> str:
    """The README's line: every supported ``model_type``, in one sentence (those that compute attention in their own
    module with the methods that leave attention alone)."""
    names = ", ".join(f"`{name}`" for name, arch in sorted(ARCHITECTURES.items()) if not arch.own_attention)
    own = ", ".join(f"`{name}`" for name, arch in sorted(ARCHITECTURES.items()) if arch.own_attention)
    table_methods = [name for name, spec in sorted(registered().items()) if not installs_attention(spec.config_class)]
    partly = f"; {own} with {', '.join(f'`{name}`' for name in table_methods)}" if own else ""
    return f"Every method works with {names} checkpoints, with any head{partly} ([families](docs/families.md))."
