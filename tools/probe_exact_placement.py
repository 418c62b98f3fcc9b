"""What the exact placement alone does to a model trained without it: evaluate a stride-patched MiniLM folder as it
is, and with position ids multiplied by k for inputs within the old length (a forward pre-hook on the embeddings,
what ``exact_short_inputs`` does, here without retraining):

    python tools/probe_exact_placement.py out/minilm-embed-2k-stride needle 256,512 exact
    python tools/probe_exact_placement.py out/minilm-embed-2k-stride needle 256,512 plain

Prints the accuracy at 1 per length (100 documents, seed 0, as ``posswap eval``).
"""

from __future__ import annotations

import sys

import torch

import posswap
from posswap.evaluation.retrieval import evaluate_retrieval


def exact_positions(old: int, stride: int):
    def hook(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None and ids.shape[1] <= old:  # a batch of one length: the documents of one task length
            kwargs["position_ids"] = (torch.arange(ids.shape[1]) * stride).unsqueeze(0)
        return args, kwargs

    return hook


def main() -> None:
    path, task, lengths, placement = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3].split(",")], sys.argv[4]
    model = posswap.from_pretrained(path)
    block = model[0].auto_model.config.posswap
    if placement == "exact":
        hook = exact_positions(block["original_length"], block["max_length"] // block["original_length"])
        model[0].auto_model.embeddings.register_forward_pre_hook(hook, with_kwargs=True)
    results = evaluate_retrieval({"model": model}, task=task, lengths=lengths, progress=False)
    print(path, task, placement, [round(a, 2) for a in results.models["model"].accuracy])


if __name__ == "__main__":
    main()
