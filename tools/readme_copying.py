"""Print the README's copying-study figures from the results JSON, so no number there is typed by hand.

    python tools/readme_copying.py            # the tables and the figures the prose quotes, as markdown

The tables are ``copying_table`` of ``results/{mini,copying,copying-rope}/copying.json`` (a test checks the README
holds them line for line); the figures are the timings and first steps the prose around them quotes.
"""

from __future__ import annotations

import json
from pathlib import Path

from posswap.study.copying_report import NEAR, copying_table, first_step

RESULTS = Path(__file__).resolve().parents[1] / "results"


def load(preset: str) -> dict:
    return json.loads((RESULTS / preset / "copying.json").read_text())


def reached(results: dict, name: str, multiple: float) -> str:
    """The first checked step at which ``name`` copies (``min_copy`` nats) at ``multiple``, or 'not within N'."""
    found = first_step(results["runs"][name], results["multiples"].index(multiple), results["min_copy"])
    return f"step {found}" if found is not None else f"not within {results['spec']['steps']} steps"


def figures() -> dict[str, str]:
    mini, study, rope = load("mini"), load("copying"), load("copying-rope")
    return {
        "mini minutes": f"{mini['timings_s']['all'] / 60:.1f}",
        "copier minutes": f"{mini['timings_s']['copier'] / 60:.1f}",
        "copying minutes": f"{study['timings_s']['all'] / 60:.1f}",
        "rope minutes": f"{rope['timings_s']['all'] / 60:.1f}",
        **{
            f"{preset}: {name} at {m:g}x": reached(data, name, m)
            for preset, data in (("copying", study), ("copying-rope", rope))
            for name in data["runs"]
            for m in (NEAR, data["target_multiple"])
        },
    }


def main() -> None:
    for preset in ("mini", "copying", "copying-rope"):
        print(f"<!-- results/{preset}/copying.json -->", *copying_table(load(preset)), "", sep="\n")
    for key, value in figures().items():
        print(f"- {key}: {value}")


if __name__ == "__main__":
    main()
