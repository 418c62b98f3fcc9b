"""What the exact placement alone does to a model trained without it: evaluate a stride-patched MiniLM folder as it
is, and with ``exact_short_inputs`` switched on at evaluation (posswap's own run-time placement, no retraining):

    python tools/probe_exact_placement.py out/minilm-embed-2k-stride needle 256,512 exact
    python tools/probe_exact_placement.py out/minilm-embed-2k-stride needle 256,512 plain

Prints the accuracy at 1 per length (100 documents, seed 0, as ``posswap eval``).
"""

from __future__ import annotations

import sys

import posswap
from posswap.embeddings.retrieval import evaluate_retrieval
from posswap.portable.posswap_architectures import find_sites
from posswap.portable.posswap_placement import install_short_input_positions


def main() -> None:
    path, task, lengths, placement = sys.argv[1], sys.argv[2], [int(n) for n in sys.argv[3].split(",")], sys.argv[4]
    model = posswap.from_pretrained(path)
    base = model[0].auto_model
    if placement == "exact":
        if base.config.posswap.get("mode") != "stride":
            raise SystemExit(f"{path} was not patched with mode stride: exact placement needs its old rows at k*i.")
        base.config.posswap = {**base.config.posswap, "exact_short_inputs": True}
        install_short_input_positions(base, find_sites(base).offset)  # the sentence-transformers module runs it
    results = evaluate_retrieval({"model": model}, task=task, lengths=lengths, progress=False)
    print(path, task, placement, [round(a, 2) for a in results.models["model"].accuracy])


if __name__ == "__main__":
    main()
