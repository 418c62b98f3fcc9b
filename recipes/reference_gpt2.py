"""Pretrain the study's reference GPT-2 from scratch: learned absolute positions, 256 of them.

    python recipes/reference_gpt2.py                     # CPU size: 6 layers x 256, <= 60 min on 2 cores
    python recipes/reference_gpt2.py --size gpu --set train.max_steps=5000

1. Trains a byte-level BPE of 8,192 tokens on the training split (posswap:train, Persuasion held out). Why
   not GPT-2's own 50k vocabulary: on 2 CPU cores its embedding and softmax dominate a small model (measured
   for a 6 x 256 GPT-2 at 256 tokens: ~600 tokens/s with 50k, ~1,650 with 8k), so the same hour sees ~3x the
   text. The tokenizer is saved with the model, so everything downstream uses it.
2. Saves a randomly initialised GPT2LMHeadModel and the tokenizer to out/reference-gpt2/init.
3. Trains it with recipes/reference-gpt2.yaml (posswap: null) and evaluates held-out perplexity at 256.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
import transformers
from tokenizers import ByteLevelBPETokenizer

from posswap.data.splits import load_split
from posswap.training import load_recipe, train

RECIPE = Path(__file__).with_name("reference-gpt2.yaml")
SIZES = {
    "cpu": dict(n_layer=6, n_embd=256, n_head=8),
    "gpu": dict(n_layer=12, n_embd=768, n_head=12),  # GPT-2 small
}
VOCAB = 8192
EOS = "<|endoftext|>"


def train_tokenizer(split: str) -> transformers.PreTrainedTokenizerFast:
    texts = load_split(split)["text"]
    bpe = ByteLevelBPETokenizer()
    bpe.train_from_iterator(texts, vocab_size=VOCAB, min_frequency=2, special_tokens=[EOS])
    tokenizer = transformers.GPT2TokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS, unk_token=EOS)
    tokenizer.model_max_length = 256
    return tokenizer


def build_init(folder: Path, size: str, split: str, seed: int) -> None:
    tokenizer = train_tokenizer(split)
    torch.manual_seed(seed)
    config = transformers.GPT2Config(
        vocab_size=len(tokenizer), n_positions=256, bos_token_id=tokenizer.eos_token_id,
        eos_token_id=tokenizer.eos_token_id, **SIZES[size],
    )
    transformers.GPT2LMHeadModel(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="cpu")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="Recipe override (repeatable).")
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args()
    recipe, raw = load_recipe(RECIPE, args.set)
    init = Path(recipe.model)
    if not (init / "config.json").exists():
        build_init(init, args.size, recipe.data.train.removeprefix("posswap:"), recipe.train.seed)
    print(f"Trained reference GPT-2 in {train(recipe, raw, resume=args.resume)}")


if __name__ == "__main__":
    main()
