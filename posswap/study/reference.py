"""The study's reference GPT-2, pretrained from scratch: learned absolute positions, 256 of them.

1. A byte-level BPE of 8,192 tokens trained on the training split (posswap:train, Persuasion held out). Why
   not GPT-2's own 50k vocabulary: on 2 CPU cores its embedding and softmax dominate a small model (measured
   for a 6 x 256 GPT-2 at 256 tokens: ~600 tokens/s with 50k, ~1,650 with 8k), so the same hour sees ~3x the
   text. The tokenizer is saved with the model, so everything downstream uses it.
2. A randomly initialised GPT2LMHeadModel and the tokenizer saved to ``<output_dir>/init``.
3. Training with ``reference-gpt2.yaml`` beside this file (``posswap: null``), then held-out perplexity at 256.
"""

from __future__ import annotations

from pathlib import Path

import torch
import transformers

RECIPE = Path(__file__).with_name("reference-gpt2.yaml")
SIZES = {
    "cpu": dict(n_layer=6, n_embd=256, n_head=8),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12),  # GPT-2 small
}
VOCAB = 8192
LENGTH = 256
EOS = "<|endoftext|>"


def train_tokenizer(split: str) -> transformers.PreTrainedTokenizerFast:
    from tokenizers import ByteLevelBPETokenizer

    from ..data.splits import load_split

    texts = load_split(split)["text"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS])
    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    tokenizer.model_max_length = LENGTH
    return tokenizer


def build_init(folder: Path, size: str, split: str, seed: int) -> None:
    if size not in SIZES:
        raise ValueError(f"size must be one of {', '.join(SIZES)}; got {size!r}.")
    tokenizer = train_tokenizer(split)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer),
        n_positions=LENGTH,
        bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        **SIZES[size],
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def pretrain_reference(size: str = "cpu", overrides: list[str] = (), resume: bool = False) -> Path:
    """Build (if needed) and train the reference; returns the folder of the trained model."""
    from ..training import load_recipe, train

    recipe, raw = load_recipe(RECIPE, list(overrides))
    init = Path(recipe.model)
    if not (init / "config.json").exists():
        build_init(init, size, recipe.data.train.removeprefix("posswap:"), recipe.train.seed)
    return train(recipe, raw, resume=resume)
