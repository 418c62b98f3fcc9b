"""How far training moved a patched model's position table from the table patching made, and how far apart
neighbouring rows stand: whether a stride-placed model learned to tell neighbours apart at its new lengths.

    python tools/position_table_drift.py out/minilm-late-2k/model posswap:minilm
    python tools/position_table_drift.py out/minilm-late-2k/model posswap:minilm --out drift.json

The reference is BASE patched with MODEL's own recorded config (``posswap.patch``, the table training started
from). Per stretch of rows (the first as many as the stock table has, and the rest): the mean length of a row's move
as a share of its starting length, and the mean distance between neighbouring rows, before and after, beside
the stock table's neighbours (the old positions' own spacing, over its middle three fifths: its first rows stand
far apart, its last are rarely read).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from posswap import patch
from posswap.loading import load_sentence_transformer
from posswap.patching import patched_config
from posswap.portable.posswap_architectures import find_sites
from posswap.sentence_models import transformer_module


def table(model) -> torch.Tensor:
    sites = find_sites(transformer_module(model).auto_model)
    return sites.table.weight.detach()[sites.table_offset :].float().clone()


def middle(rows: int) -> slice:
    """The stock table's ordinary rows ([102, 410) of 512)."""
    return slice(rows // 5, rows - rows // 5)


def neighbours(rows: torch.Tensor) -> float:
    return (rows[1:] - rows[:-1]).norm(dim=1).mean().item()


def loaded(name: str):
    model = load_sentence_transformer(name)
    if model is None:
        raise SystemExit(f"{name} is not a sentence-transformers model folder or repo: pass one (posswap:minilm, ...).")
    return model


def drift(model_path: str, base: str) -> dict:
    trained = loaded(model_path)
    config = patched_config(transformer_module(trained).auto_model)
    if config is None:
        raise SystemExit(f"{model_path} is not a posswap-patched model: nothing to compare with.")
    stock = loaded(base)
    old = table(stock)
    patch(stock, config)
    start, end = table(stock), table(trained)
    moved = (end - start).norm(dim=1) / start.norm(dim=1)
    stretches = {"first rows": slice(0, len(old)), "the rest": slice(len(old), len(end))}
    return {
        "model": model_path,
        "base": base,
        "stock_rows": [middle(len(old)).start, middle(len(old)).stop],
        "stock_neighbours": neighbours(old[middle(len(old))]),
        "stretches": {
            name: {
                "rows": [rows.start, rows.stop],
                "moved_share": moved[rows].mean().item(),
                "neighbours_before": neighbours(start[rows]),
                "neighbours_after": neighbours(end[rows]),
            }
            for name, rows in stretches.items()
        },
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model", help="a trained posswap model folder")
    parser.add_argument("base", help="the model it was patched from (posswap:minilm, a folder, a Hub id)")
    parser.add_argument("--out", type=Path, help="also write the figures here as JSON")
    args = parser.parse_args(argv)
    result = drift(args.model, args.base)
    first, last = result["stock_rows"]
    print(f"stock table, neighbouring rows {result['stock_neighbours']:.3f} apart (rows {first}-{last})")
    for name, s in result["stretches"].items():
        print(
            f"{name} {s['rows'][0]}-{s['rows'][1]}: moved {s['moved_share']:.1%} of a row; neighbours "
            f"{s['neighbours_before']:.3f} apart before training, {s['neighbours_after']:.3f} after"
        )
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
