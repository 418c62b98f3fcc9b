"""Where each supported architecture keeps its position machinery.

An :class:`Architecture` is a plain description (attribute paths, the position offset); :func:`find_sites`
resolves it on a live model into :class:`Sites`, the modules a method touches. Adding a BERT-like
architecture is one entry in ``ARCHITECTURES``.

It travels with saved models (``posswap/portable``, copied beside the weights), so it imports nothing from
posswap.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

# Buffers that BERT-family embeddings size to the position table; GPT-2 has none.
POSITION_SIZED_BUFFERS = ("position_ids", "token_type_ids")


@dataclass(frozen=True)
class Architecture:
    model_type: str
    embeddings: str  # path from the base model to the module that owns the table ("" = the base model)
    table: str  # attribute holding the nn.Embedding of positions on that module
    self_attention: str  # path to every self-attention module, "*" iterating a ModuleList
    causal: bool  # decoder (GPT-2) or bidirectional encoder
    # q/k projections on each self-attention module, with the hidden-size chunks of their output that are
    # queries or keys: GPT-2's fused c_attn gives [q | k | v], BERT has separate query and key.
    qk_projections: tuple[tuple[str, tuple[int, ...]], ...]
    lora_targets: tuple[str, ...]  # self-attention projections LoRA adapts
    conv1d: bool  # GPT-2's projections are Conv1D, weights stored (in, out): peft's fan_in_fan_out
    # The transformer block, FSDP's unit of wrapping (recipes/accelerate/fsdp.yaml lists them); an encoder-decoder
    # names its two, comma-separated as the FSDP config lists them (``layer_classes``).
    layer_class: str
    offset: Callable[[object], int] = lambda config: 0  # table rows before the first real position
    # Linear map from the embeddings to the first layer's width, path from the base model (ELECTRA's small
    # embeddings, only there when its embedding size differs from the hidden size; ALBERT's, always there).
    embedding_projection: str = ""
    # The LayerNorm a position vector passes before the first layer's q/k projections (path from the base model).
    first_norm: str = "embeddings.LayerNorm"
    class_prefix: str = ""  # transformers' class-name prefix of the family ("Bert" in BertForMaskedLM)
    size_name: str = "max_position_embeddings"  # the config field users know the length by (GPT-2: n_positions)
    # The native architecture `posswap export` writes for a RoPE model: "roformer" (BERT's layout), "gpt_neox"
    # (GPT-2's), or "" where none computes the same (refused in one line).
    native_export: str = "roformer"
    # Whether the base model hands the caller's position_ids down to its attention modules' kwargs (BERT, ALBERT,
    # GPT-2 do; DistilBERT only gives them to its embeddings: posswap_positions.py carries them down).
    passes_position_ids: bool = True
    # Why posswap's attention methods (rope, alibi, t5-bias, tupe: those with a `backend` option) cannot run on the
    # family: its attention is computed in its own module, not through transformers' attention interface where
    # posswap installs its kernels ("" = it goes through that interface; every method runs). The refusal names it.
    own_attention: str = ""
    note: str = ""  # a fact of the family the supported-families table shows (docs/families.md)
    # The modules every head calls directly, as (path from the base model, causal): where the table, the layers and
    # posswap's hooks live. () = the base model itself (BERT, GPT-2). OPT's heads call model.decoder, past
    # OPTModel.forward; BART has two, the encoder (bidirectional) and the decoder (causal), each with its own table
    # and one max_position_embeddings for both.
    stacks: tuple[tuple[str, bool], ...] = ()
    # Rows the table module adds to the ids itself (OPT's and BART's learned table: 2), which neither the config's
    # max_position_embeddings nor the ids a caller passes count; RoBERTa's padding rows (``offset``) are counted.
    inner_offset: int = 0
    # Buffers of each self-attention module sized to the length, rebuilt at the new one: (attention, config, rows)
    # -> {name: tensor}. GPT-Neo's causal mask (with its local layers' window) is (1, 1, rows, rows).
    attention_buffers: Callable[[nn.Module, object, int], dict[str, torch.Tensor]] | None = None

    @property
    def layer_classes(self) -> set[str]:
        return set(self.layer_class.split(","))

    @property
    def encoder_decoder(self) -> bool:
        return len(self.stacks) > 1


def padding_offset(config) -> int:
    # RoBERTa-style models number positions from padding_idx + 1 (rows 0..padding_idx are never real positions).
    return config.pad_token_id + 1


_BERT_LIKE = dict(
    embeddings="embeddings",
    table="position_embeddings",
    self_attention="encoder.layer.*.attention.self",
    causal=False,
    qk_projections=(("query", (0,)), ("key", (0,))),
    lora_targets=("query", "key", "value"),
    conv1d=False,
)


def _bert_like(**changes) -> dict:
    """BERT's layout with the fields a family names differently (its attention's path, its projections)."""
    return {**_BERT_LIKE, **changes}


_DECODER_LIKE = dict(
    embeddings="",
    table="embed_positions",
    self_attention="layers.*.self_attn",
    causal=True,
    qk_projections=(("q_proj", (0,)), ("k_proj", (0,))),
    lora_targets=("q_proj", "k_proj", "v_proj"),
    conv1d=False,
    native_export="",
)


def _decoder_like(**changes) -> dict:
    """OPT's layout (q_proj / k_proj / v_proj under layers.*.self_attn, the table on the stack), with what a family
    names differently."""
    return {**_DECODER_LIKE, **changes}


_ENCODER_DECODER = dict(
    **_decoder_like(first_norm="layernorm_embedding"),
    stacks=(("encoder", False), ("decoder", True)),
    inner_offset=2,
    note="an encoder and a decoder table, both at `max_length` (one `config.max_position_embeddings`, as `generate` "
    "reads it)",
)


def gpt_neo_causal_mask(attention: nn.Module, config, rows: int) -> dict[str, torch.Tensor]:
    """GPTNeoSelfAttention's ``bias`` at ``rows`` positions, as its __init__ builds it (a local layer's window too)."""
    old = attention.bias
    mask = torch.tril(torch.ones((rows, rows), dtype=torch.bool, device=old.device)).view(1, 1, rows, rows)
    if attention.attention_type == "local":
        mask = torch.bitwise_xor(mask, torch.tril(mask, -config.window_size))
    return {"bias": mask}


ARCHITECTURES: dict[str, Architecture] = {
    "bert": Architecture("bert", **_BERT_LIKE, layer_class="BertLayer", class_prefix="Bert"),
    "electra": Architecture(
        "electra",
        **_BERT_LIKE,
        layer_class="ElectraLayer",
        class_prefix="Electra",
        embedding_projection="embeddings_project",
    ),
    "roberta": Architecture(
        "roberta", **_BERT_LIKE, layer_class="RobertaLayer", class_prefix="Roberta", offset=padding_offset
    ),
    "xlm-roberta": Architecture(
        "xlm-roberta", **_BERT_LIKE, layer_class="XLMRobertaLayer", class_prefix="XLMRoberta", offset=padding_offset
    ),
    # CamemBERT is RoBERTa under another name: its padding offset too.
    "camembert": Architecture(
        "camembert", **_BERT_LIKE, layer_class="CamembertLayer", class_prefix="Camembert", offset=padding_offset
    ),
    # No token types; its attention projections are q_lin / k_lin / v_lin, and its base model gives the caller's
    # position_ids to the embeddings only.
    "distilbert": Architecture(
        "distilbert",
        **_bert_like(
            self_attention="transformer.layer.*.attention",
            qk_projections=(("q_lin", (0,)), ("k_lin", (0,))),
            lora_targets=("q_lin", "k_lin", "v_lin"),
        ),
        layer_class="TransformerBlock",
        class_prefix="DistilBert",
        native_export="",
        passes_position_ids=False,
    ),
    # One layer module per group, reused across depth: each self-attention is hooked once and runs at every depth
    # that shares it. Embeddings of embedding_size are mapped to the layers' width by the encoder's first Linear.
    "albert": Architecture(
        "albert",
        **_bert_like(self_attention="encoder.albert_layer_groups.*.albert_layers.*.attention"),
        layer_class="AlbertLayer",
        class_prefix="Albert",
        embedding_projection="encoder.embedding_hidden_mapping_in",
        native_export="",
    ),
    # Attention computed in MPNetSelfAttention itself (matmul, mask, softmax), plus a T5-style relative bias the
    # encoder computes once from 0..n-1 and shares with every layer: the table methods run, the attention methods are
    # refused. Its table numbers positions from padding_idx + 1 = 2 (padding_idx is 1 in transformers, as the
    # config's pad_token_id and the tokenizer's pad id).
    "mpnet": Architecture(
        "mpnet",
        **_bert_like(
            self_attention="encoder.layer.*.attention.attn",
            qk_projections=(("q", (0,)), ("k", (0,))),
            lora_targets=("q", "k", "v"),
        ),
        layer_class="MPNetLayer",
        class_prefix="MPNet",
        offset=padding_offset,
        native_export="",
        passes_position_ids=False,
        own_attention="MPNet computes attention in its own module, with its own relative position bias, and does not "
        "hand positions to its attention",
        note="its own relative bias (buckets to 128 tokens) stays as it is under `interpolate`, `sinusoidal` and `nope`",
    ),
    # Attention computed in GPTNeoSelfAttention itself, with a causal mask buffer sized to the length (its local
    # layers' window cut into it): the table methods run, the mask rebuilt at the new length.
    "gpt_neo": Architecture(
        "gpt_neo",
        **_decoder_like(table="wpe", self_attention="h.*.attn.attention", first_norm="h.0.ln_1"),
        layer_class="GPTNeoBlock",
        class_prefix="GPTNeo",
        own_attention="GPT-Neo computes attention in its own module, with a causal mask of its own, not through "
        "transformers' attention interface",
        attention_buffers=gpt_neo_causal_mask,
        note="its local layers keep their window of `config.window_size` tokens at every length",
    ),
    # The heads call model.decoder directly; its table adds 2 to the ids itself, and the ids count real tokens only
    # (from the attention mask: a left-padded row starts at 0).
    "opt": Architecture(
        "opt",
        **_decoder_like(first_norm="layers.0.self_attn_layer_norm"),
        layer_class="OPTDecoderLayer",
        class_prefix="OPT",
        stacks=(("decoder", True),),
        inner_offset=2,
        note="positions count the real tokens from the attention mask (a left-padded row starts at 0)",
    ),
    # Two stacks, each with its table; one max_position_embeddings for both (what generate and the tokenizer read).
    "bart": Architecture(
        "bart", **_ENCODER_DECODER, layer_class="BartEncoderLayer,BartDecoderLayer", class_prefix="Bart"
    ),
    "mbart": Architecture(
        "mbart", **_ENCODER_DECODER, layer_class="MBartEncoderLayer,MBartDecoderLayer", class_prefix="MBart"
    ),
    "gpt2": Architecture(
        "gpt2",
        embeddings="",
        table="wpe",
        self_attention="h.*.attn",
        causal=True,
        qk_projections=(("c_attn", (0, 1)),),
        lora_targets=("c_attn",),
        conv1d=True,
        layer_class="GPT2Block",
        first_norm="h.0.ln_1",
        class_prefix="GPT2",
        size_name="n_positions",
        native_export="gpt_neox",
    ),
}


# Families with a learned position table that posswap does not patch yet, and why: the refusal names it, and the
# supported-families table lists it (``python -m posswap.cli.generate --write``).
NOT_YET: dict[str, str] = {}


@dataclass
class Sites:
    """The live modules of one model that position methods read and change."""

    arch: Architecture
    model: nn.Module  # what the user holds (any head)
    base: nn.Module  # the module every head calls (model.base_model; OPT's decoder; BART's encoder or decoder)
    owner: nn.Module  # module owning the position table and position-sized buffers
    offset: int  # ids of position 0 (RoBERTa: padding_idx + 1), as the config and a caller's position_ids count them

    @property
    def table_offset(self) -> int:
        """Rows of the table weight before position 0: the counted offset and the rows the table adds itself."""
        return self.offset + self.arch.inner_offset

    @property
    def config(self):
        return self.model.config

    @property
    def table(self) -> nn.Embedding | None:
        """The learned position table, or None once a method has dropped it."""
        table = getattr(self.owner, self.arch.table)
        return table if isinstance(table, nn.Embedding) else None

    @property
    def table_dim(self) -> int:
        """Width of the position vectors (ELECTRA: embedding_size), from the table or what replaced it."""
        slot = getattr(self.owner, self.arch.table)
        return slot.embedding_dim if isinstance(slot, nn.Embedding) else slot.dim

    @property
    def max_length(self) -> int:
        """Tokens the model reads now."""
        return self.config.max_position_embeddings - self.offset

    def self_attentions(self) -> list[nn.Module]:
        return _resolve(self.base, self.arch.self_attention)


def find_sites(model: nn.Module) -> Sites:
    """The sites of the model's first stack (an encoder-decoder's encoder): what reading and export look at."""
    return find_stacks(model)[0]


def find_stacks(model: nn.Module) -> list[Sites]:
    """The sites of every stack with a table: one for most families, the encoder's and the decoder's for BART."""
    config = getattr(model, "config", None)
    model_type = getattr(config, "model_type", None)
    if model_type not in ARCHITECTURES:
        why = f": {NOT_YET[model_type]}" if model_type in NOT_YET else ""
        raise ValueError(
            f"posswap does not support model_type {model_type!r} ({type(model).__name__}){why}. "
            f"Supported model types: {', '.join(sorted(ARCHITECTURES))}."
        )
    family = ARCHITECTURES[model_type]
    stacks = []
    for path, causal in family.stacks or (("", family.causal),):
        arch = dataclasses.replace(family, causal=causal) if causal != family.causal else family
        base = _resolve(model.base_model, path)[0] if path else model.base_model
        owner = _resolve(base, arch.embeddings)[0] if arch.embeddings else base
        stacks.append(Sites(arch=arch, model=model, base=base, owner=owner, offset=arch.offset(config)))
    return stacks


def resized_position_buffers(sites: Sites, rows: int) -> dict[str, torch.Tensor]:
    """New values for the position-sized buffers, built before anything is assigned."""
    new = {}
    for name in POSITION_SIZED_BUFFERS:
        old = getattr(sites.owner, name, None)
        if old is None:
            continue
        if name == "position_ids":
            new[name] = torch.arange(rows, device=old.device, dtype=old.dtype).expand((1, -1))
        else:
            new[name] = torch.zeros((1, rows), device=old.device, dtype=old.dtype)
    return new


def resized_attention_buffers(sites: Sites, rows: int) -> list[tuple[nn.Module, dict[str, torch.Tensor]]]:
    """New values of each self-attention's length-sized buffers (GPT-Neo's causal mask), built before any change."""
    build = sites.arch.attention_buffers
    return [] if build is None else [(a, build(a, sites.config, rows)) for a in sites.self_attentions()]


def assign_buffers(module: nn.Module, buffers: dict[str, torch.Tensor]) -> None:
    for name, value in buffers.items():
        persistent = name not in module._non_persistent_buffers_set
        module.register_buffer(name, value, persistent=persistent)


def _resolve(root: nn.Module, path: str) -> list[nn.Module]:
    modules = [root]
    for part in path.split("."):
        if part == "*":
            modules = [child for m in modules for child in m.children()]
        else:
            modules = [getattr(m, part) for m in modules]
    return modules
