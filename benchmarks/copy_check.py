"""Does a causal LM copy at all? The repeat probe with no filler (d = 0) and short fillers, on held-out text and
on random-token spans (the classic induction-head test: a random span cannot be predicted the first time, only
copied the second). A model with induction heads shows a drop of several nats on random spans; one without
shows none, and then no setting of the study's probe can show it reading back across a distance.

    python benchmarks/copy_check.py out/reference-gpt2/model
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from posswap.data.splits import load_text_dataset
from posswap.evaluation.repeat import repeat_probe
from posswap.evaluation.stream import token_stream


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a causal LM folder or Hub id")
    parser.add_argument("--spans", type=int, default=20, help="trials per distance")
    parser.add_argument(
        "--distances",
        default=[0, 16, 64],
        type=lambda text: [int(d) for d in text.split(",")],
        help="filler lengths in tokens, comma-separated (default 0,16,64)",
    )
    args = parser.parse_args()
    model = AutoModelForCausalLM.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    distances = args.distances
    text = token_stream(load_text_dataset("posswap:austen-heldout")["text"], tokenizer, 100_000)
    random = torch.randint(0, model.config.vocab_size, (100_000,), generator=torch.Generator().manual_seed(0))
    print("stream | span | d | first occurrence | second | drop (nats) ± se")
    for name, stream, spans in (("text", text, (32, 64, 128)), ("random tokens", random, (32,))):
        for span in spans:
            found = repeat_probe(
                model, tokenizer, stream, span=span, distances=distances, spans_per_distance=args.spans, progress=False
            )
            for i, d in enumerate(distances):
                print(
                    f"{name} | {span} | {d} | {found['reference'][i]:.2f} | {found['repeat'][i]:.2f} | "
                    f"{found['drop'][i]:.3f} ± {found['drop_se'][i]:.3f}"
                )


if __name__ == "__main__":
    main()
