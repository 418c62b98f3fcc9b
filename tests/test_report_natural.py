"""The natural-reference table of docs/late-chunking.md (posswap.embeddings.report_context.natural_block): each cell
is the fact accuracy ± standard error of the file it names, the baselines' stock and untrained rows first, and a
run that scored other documents is refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from posswap.embeddings.report_context import natural_block


def context(late: list[float], fingerprint: str = "a") -> dict:
    def row(accuracy):
        return {
            "accuracy": accuracy,
            "stderr": [0.1, 0.1],
            "fact_accuracy": accuracy,
            "fact_stderr": [0.05, 0.04],
            "fact_hits": [[1.0, 1.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0]],
        }

    rows = {
        "minilm chunks": row([0.5, 0.5]),
        "stride-untrained late chunks": row([0.55, 0.52]),
        "model late chunks": row(late),
    }
    rows |= {"minilm": row([0.1, 0.1]), "model": row([0.2, 0.2])}
    settings = {
        "fingerprints": {"512": fingerprint},
        "chance": {"fact_accuracy": [0.5]},
        "made": "4 documents a length",
        "queries": {n: [{"template": f"nearest-{t}"} for t in ("subject", "other") * 2] for n in ("512", "1024")},
    }
    return {"lengths": [512, 1024], "documents": 4, "seed": 0, "chunk_tokens": 128, "settings": settings, "rows": rows}


def write(path: Path, record: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_each_cell_is_its_files_fact_accuracy(tmp_path):
    write(tmp_path / "natural-reference" / "recipe-seed0" / "context.json", context([0.61, 0.58]))
    tried = tmp_path / "history" / "natural-seed0"
    write(tried / "context" / "context.json", context([0.0, 0.0]))  # a run: the templated task
    write(tried / "natural" / "context.json", context([0.72, 0.66]))
    lines = natural_block(tmp_path)
    assert lines[0] == "| vectors | 512 tokens | 1024 tokens |"
    assert lines[2:6] == [
        "| the stock model's chunks | 0.50 ± 0.05 | 0.50 ± 0.04 |",
        "| the untrained patch's late chunks | 0.55 ± 0.05 | 0.52 ± 0.04 |",
        "| recipe-seed0's late chunks | 0.61 ± 0.05 | 0.58 ± 0.04 |",
        "| natural-seed0's late chunks | 0.72 ± 0.05 | 0.66 ± 0.04 |",
    ]
    assert "chance 0.50" in lines[7] and "4 documents a length" in lines[7]
    # By the nearest name before the fact chunk: hits 1, 1, 1, 0 are subject 1 and 1, other 1 and 0.
    assert lines[-3:] == [
        "| the untrained patch's late chunks | 1.00 / 0.50 | 0.50 / 0.00 |",
        "| recipe-seed0's late chunks | 1.00 / 0.50 | 0.50 / 0.00 |",
        "| natural-seed0's late chunks | 1.00 / 0.50 | 0.50 / 0.00 |",
    ]


def test_a_run_on_other_documents_is_refused(tmp_path):
    write(tmp_path / "natural-reference" / "recipe-seed0" / "context.json", context([0.61, 0.58]))
    tried = tmp_path / "history" / "natural-seed0"
    write(tried / "context" / "context.json", context([0.0, 0.0]))
    write(tried / "natural" / "context.json", context([0.72, 0.66], fingerprint="b"))
    with pytest.raises(SystemExit, match="natural-seed0's natural-reference results scored other documents"):
        natural_block(tmp_path)


def test_no_natural_results_is_no_block(tmp_path):
    assert natural_block(tmp_path) == []


def test_transfer_reads_the_first_and_last_shift_lines(tmp_path):
    from posswap.embeddings.report_context import transfer_lines

    tried = tmp_path / "history" / "natural-seed0"
    write(tried / "context" / "context.json", context([0.0, 0.0]))
    lines = [
        {"label": "recipe's templates", "queries": 8, "first_hits": {"the fact's chunk": 0.75, "other": 0.25}},
        {"label": "a mix", "queries": 8, "first_hits": {"the fact's chunk": 0.5, "other": 0.5}},
        {"label": "evaluation's templates", "queries": 8, "first_hits": {"other": 1.0}},
    ]
    write(tried / "shift-2048.json", {"length": 2048, "documents": 4, "task_seed": 5, "lines": lines})
    (line,) = transfer_lines(tmp_path)
    assert line.endswith(
        "the fact's chunk first 0.75 on recipe's templates, 0.00 on evaluation's templates (the recipe's novels)."
    )
    assert "natural-seed0" in line and "4 documents of task seed 5" in line
    recorded = {"length": 2048, "documents": 4, "task_seed": 5, "lines": lines}
    write(tried / "shift-2048.json", recorded | {"recipe_haystacks": ["emma", "sqlite-docs", "emma"]})
    (line,) = transfer_lines(tmp_path)
    assert line.endswith("0.00 on evaluation's templates (the recipe's cut from emma, sqlite-docs).")
