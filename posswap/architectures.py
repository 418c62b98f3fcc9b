"""Per-architecture facts. They live in ``posswap/portable`` because saved models carry them; this is their
name inside the library."""

from .portable.posswap_architectures import (  # noqa: F401
    ARCHITECTURES,
    POSITION_SIZED_BUFFERS,
    Architecture,
    Sites,
    assign_buffers,
    find_sites,
    resized_position_buffers,
)

# What a position vector passes through between the table and the first layer's q/k projections (paths from the
# base model): the LayerNorm, then an optional projection (ELECTRA's embeddings_project, only when its embedding
# size differs from the hidden size). t5-bias's init="fit" follows it; run time never needs it.
_BERT_LIKE_INPUT = ("embeddings.LayerNorm", "embeddings_project")
FIRST_LAYER_INPUT = {
    "bert": _BERT_LIKE_INPUT,
    "electra": _BERT_LIKE_INPUT,
    "roberta": _BERT_LIKE_INPUT,
    "xlm-roberta": _BERT_LIKE_INPUT,
    "gpt2": ("h.0.ln_1", None),
}
