"""results/context/history keeps at most ten runs (posswap.embeddings.history): an older one leaves its row in
results/context/history-summary.json, and the placement table of docs/late-chunking.md shows it from there."""

from __future__ import annotations

import json
from pathlib import Path

from posswap.embeddings import history

ROOT = Path(__file__).resolve().parents[1]


def fake_run(folder: Path, late: float, diff: bool = True) -> Path:
    """A run folder with the context task's late chunks at two lengths (and a changes.diff)."""
    (folder / "context").mkdir(parents=True)
    rows = {"stock chunks": {"accuracy": [0.0, 0.0]}, "model late chunks": {"accuracy": [late, late / 2]}}
    (folder / "context" / "context.json").write_text(json.dumps({"lengths": [512, 1024], "rows": rows}))
    if diff:
        (folder / "changes.diff").write_text("--- a/x.py\n+++ b/posswap/x.py\n@@\n")
    return folder


def test_a_diff_written_either_way_round_names_its_file():
    # git diff --no-index NEW OLD heads it "+++ a/"; those runs lost their placement row when pruned
    assert history.changed_files("--- a/x.py\n+++ b/posswap/x.py\n@@\n") == ["posswap/x.py"]
    assert history.changed_files("--- b/r.yaml\n+++ a/recipes/r.yaml\n@@\n+++ extra\n") == ["recipes/r.yaml"]
    summary = json.loads((ROOT / "results" / "context" / history.SUMMARY).read_text())["rows"]
    stride = [r for r in summary if r["entry"].startswith("minilm-late-2k-one-stride-table")]
    assert len(stride) == 3 and all(r["changes"] == ["recipes/minilm-late-2k.yaml"] for r in stride)


def test_the_committed_history_holds_at_most_ten_runs():
    folder = ROOT / "results" / "context" / "history"
    assert len([p for p in folder.iterdir() if p.is_dir()]) <= history.CAP
    assert json.loads((folder / history.INDEX).read_text())["order"]  # the order a prune goes by


def test_adding_past_the_cap_summarises_the_oldest_then_removes_it(tmp_path):
    folder = tmp_path / "results" / "context" / "history"
    for i in range(3):
        history.add(fake_run(tmp_path / f"run{i}", 0.5 + i / 10), folder, cap=2)
    assert sorted(p.name for p in folder.iterdir() if p.is_dir()) == ["run1", "run2"]
    assert json.loads((folder / history.INDEX).read_text())["order"] == ["run1", "run2"]
    rows = json.loads((folder.parent / history.SUMMARY).read_text())["rows"]
    assert [(r["run"], r["context"], r["changes"]) for r in rows] == [("run0", [0.5, 0.25], ["posswap/x.py"])]
    history.add(fake_run(tmp_path / "run3", 0.9, diff=False), folder, cap=2)  # the summary grows, it is not rewritten
    assert [r["run"] for r in json.loads((folder.parent / history.SUMMARY).read_text())["rows"]] == ["run0", "run1"]


def test_prune_goes_by_the_index_then_by_name(tmp_path):
    folder = tmp_path / "results" / "context" / "history"
    for name in ("b", "a", "c"):
        fake_run(folder / name, 0.4)
    (folder / history.INDEX).write_text(json.dumps({"order": ["c"]}))
    assert history.prune(folder, cap=1) == ["c", "a"]
    assert [p.name for p in folder.iterdir() if p.is_dir()] == ["b"]


def test_a_run_a_graph_compares_with_is_not_dropped(tmp_path):
    """A graph run's source.json names a history run as its torch figures: adding past the cap refuses before
    anything moves, and the run and the history stay as they were."""
    graphs = tmp_path / "results"
    folder = graphs / "context" / "history"
    history.add(fake_run(tmp_path / "old", 0.5), folder, cap=1)
    (graphs / "onnx" / "graph-int8").mkdir(parents=True)
    source = {"graph": "g.onnx", "torch_results": str(folder / "old")}
    (graphs / "onnx" / "graph-int8" / "source.json").write_text(json.dumps(source))
    try:
        history.add(fake_run(tmp_path / "new", 0.7), folder, cap=1)
    except ValueError as error:
        assert "holds the torch figures" in str(error) and "graph-int8" in str(error)
    else:
        raise AssertionError("the history dropped a run a graph compares with")
    assert (tmp_path / "new").is_dir() and (folder / "old" / "context" / "context.json").is_file()
    assert json.loads((folder / history.INDEX).read_text())["order"] == ["old"]
    assert not (folder.parent / history.SUMMARY).exists()


def test_every_graph_run_finds_its_torch_figures():
    for source in (ROOT / "results").glob("*/*/source.json"):
        named = json.loads(source.read_text()).get("torch_results")
        assert not named or (ROOT / named).is_dir(), f"{source}: {named} is gone"


def test_the_command_says_a_refusal_in_one_line(tmp_path, capsys):
    """A name the committed history holds: one line on stderr, exit 2, the run left where it was."""
    taken = history.order(ROOT / "results" / "context" / "history")[-1]
    run = fake_run(tmp_path / "run", 0.5)
    assert history.main(["add", str(run), "--name", taken]) == 2
    err = capsys.readouterr().err
    assert err.startswith("history: ") and "give the run another --name" in err and err.count("\n") == 1
    assert (run / "context" / "context.json").is_file()
