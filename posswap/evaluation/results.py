"""The results of one evaluation: plain lists aligned with ``lengths``, so the JSON file round-trips and the
README, model cards and recipes can read it without posswap."""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path


@dataclass
class ModelResults:
    kind: str  # "causal", "masked" or "encoder" (no LM head: nothing to score tokens with)
    limit: int | None  # tokens the model reads
    metrics: dict[str, list] = field(default_factory=dict)  # name -> one value (or None) per length
    per_position: list[dict | None] = field(default_factory=list)  # per length: {"edges": [...], "loss": [...]}
    passkey: dict | None = None  # {"depths": [...], "trials": n, "accuracy": [[per depth] per length]}
    notes: list[str] = field(default_factory=list)


@dataclass
class Results:
    lengths: list[int]
    data: str
    settings: dict = field(default_factory=dict)
    models: dict[str, ModelResults] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> Results:
        models = {name: ModelResults(**value) for name, value in data["models"].items()}
        return cls(lengths=list(data["lengths"]), data=data["data"], settings=dict(data["settings"]), models=models)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=2) + "\n")
        return path

    @classmethod
    def load(cls, path: str | Path) -> Results:
        return cls.from_dict(json.loads(Path(path).read_text()))

    def table(self) -> str:
        """One row per model and metric, one column per length."""
        header = ["model", "metric"] + [str(length) for length in self.lengths]
        rows = []
        for name, result in self.models.items():
            shown = False
            for metric in ("ppl", "mlm_loss", "mlm_accuracy", "passkey", "read_as", "adjacent_cos"):
                values = result.metrics.get(metric)
                if values is not None:
                    rows.append([name, metric] + [_cell(v) for v in values])
                    shown = True
            if not shown:
                rows.append([name, "-"] + ["-" for _ in self.lengths])
        widths = [max(len(str(row[i])) for row in [header] + rows) for i in range(len(header))]
        lines = ["  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)) for row in [header] + rows]
        notes = [f"{name}: {note}" for name, result in self.models.items() for note in result.notes]
        if any("adjacent_cos" in result.metrics for result in self.models.values()):
            notes.append(
                "adjacent_cos: mean cosine similarity of neighbouring rows of the position table up to that length."
            )
        return "\n".join(lines + notes)


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return "inf" if math.isinf(value) else f"{value:.4g}"
    return str(value)
