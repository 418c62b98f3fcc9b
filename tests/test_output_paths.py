"""Every folder the command line writes, named by paths of awkward shapes (issue 28): ``..`` (absolute, and relative
to the working folder), spaces, Unicode (``modèle ü``), a trailing slash, and all of them at once. Each command
writes the folder meant (and nothing beside it), and a model folder loads back with posswap.from_pretrained:
``posswap patch --out`` (a GPT-2 and a sentence-transformers folder), ``posswap train`` (``train.output_dir`` from
the recipe and from ``--set``), ``posswap eval --out``, ``posswap export --out`` and ``posswap study --work/--out``
(the copying study, on a toy preset).

One tiny GPT-2 (2 layers, 64 wide, 32 positions, the GPT-2 tokenizer) is made once; one patched RoPE folder, itself
at an awkward path, is what eval and export read.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
import transformers
from test_copying import toy_spec

import posswap
from posswap.cli import main
from posswap.data import GPT2_TOKENIZER_DIR, read_document
from posswap.study import copying

LENGTH = 64


def dot_dot(root: Path, name: str):
    return f"{root}/made/../{name}", root / name


def relative_dot_dot(root: Path, name: str):  # the working folder is root/cwd
    return f"../{name}", root / name


def spaces(root: Path, name: str):
    return f"{root}/with space/{name} out", root / "with space" / f"{name} out"


def unicode(root: Path, name: str):
    return f"{root}/modèle ü/{name} é", root / "modèle ü" / f"{name} é"


def trailing_slash(root: Path, name: str):
    return f"{root}/{name}/", root / name


def everything(root: Path, name: str):
    return f"{root}/made/../tout ensemble/{name} ü/", root / "tout ensemble" / f"{name} ü"


SHAPES = {
    f.__name__.replace("_", "-"): f for f in (dot_dot, relative_dot_dot, spaces, unicode, trailing_slash, everything)
}


@pytest.fixture
def root(tmp_path, monkeypatch):
    """A fresh folder with ``made/`` (what ``made/..`` passes through) and ``cwd/``, the working folder."""
    (tmp_path / "made").mkdir()
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    return tmp_path


def tree(root: Path) -> set[Path]:
    return set(root.rglob("*"))


def assert_only_wrote(root: Path, before: set[Path], *targets: Path) -> None:
    """Everything new under ``root`` is one of ``targets``, inside one, or a folder on the way to one (no sibling
    with a mangled name, no staging folder or lock file left behind)."""
    allowed = set()
    for target in targets:
        allowed |= {target, *(p for p in target.parents if root in p.parents)}
    stray = sorted(
        str(p.relative_to(root))
        for p in tree(root) - before
        if p not in allowed and not any(t in p.parents for t in targets)
    )
    assert not stray, stray


def logits(model, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=ids).logits


IDS = torch.randint(0, 50000, (2, 48), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """The tiny GPT-2 with the GPT-2 tokenizer, and a training / scoring text beside it."""
    folder = tmp_path_factory.mktemp("base")
    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=len(tokenizer), n_positions=32)
    transformers.GPT2LMHeadModel(config).save_pretrained(folder / "gpt2")
    tokenizer.save_pretrained(folder / "gpt2")
    (folder / "text.txt").write_text(read_document("emma")[:20000])
    return folder


@pytest.fixture(scope="module")
def rope_reference(base):
    """The base patched in memory as the CLI patches it."""
    model = transformers.GPT2LMHeadModel.from_pretrained(base / "gpt2")
    return posswap.patch(model, posswap.RopeConfig(max_length=LENGTH)).eval()


@pytest.fixture(scope="module")
def patched_folder(base, tmp_path_factory) -> Path:
    """One patched RoPE GPT-2, written by ``posswap patch`` to an awkward folder: what eval and export read."""
    root = tmp_path_factory.mktemp("patched")
    (root / "made").mkdir()
    given, expected = everything(root, "rope")
    args = ["patch", str(base / "gpt2"), "--method", "rope", "--max-length", str(LENGTH), "--out", given]
    assert main(args) == 0
    return expected


# --- posswap patch ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_patch_writes_the_folder_meant(base, rope_reference, root, shape, capsys):
    given, expected = SHAPES[shape](root, "patched")
    before = tree(root)
    args = ["patch", str(base / "gpt2"), "--method", "rope", "--max-length", str(LENGTH), "--out", given]
    assert main(args) == 0, capsys.readouterr().err
    assert (expected / "config.json").is_file() and (expected / "model.safetensors").is_file()
    assert_only_wrote(root, before, expected)
    loaded = posswap.from_pretrained(given).eval()  # the path as the user wrote it
    assert loaded.config.posswap["method"] == "rope" and loaded.config.n_positions == LENGTH
    torch.testing.assert_close(logits(loaded, IDS), logits(rope_reference, IDS), atol=1e-6, rtol=0)
    again = posswap.from_pretrained(str(expected)).eval()  # and normalised
    assert torch.equal(logits(again, IDS), logits(loaded, IDS))
    assert transformers.AutoTokenizer.from_pretrained(expected).model_max_length == LENGTH
    # A second write to the same awkward path is refused (it is the same folder), and --overwrite replaces it.
    assert main(args) == 2 and "already exists" in capsys.readouterr().err
    if shape == "everything":
        assert main([*args, "--overwrite"]) == 0
        assert_only_wrote(root, before, expected)


@pytest.fixture(scope="module")
def tiny_st(minilm_path, tmp_path_factory):
    """A sentence-transformers folder around a tiny BERT (MiniLM's tokenizer, mean pooling)."""
    st = pytest.importorskip("sentence_transformers")
    from test_sentence_transformers import tiny_sentence_transformer

    root = tmp_path_factory.mktemp("st")
    model = tiny_sentence_transformer(root / "bert", minilm_path)
    model.save(str(root / "st"))
    texts = ["A short sentence.", " ".join(["Emma Woodhouse, handsome, clever, and rich"] * 6)]
    reference = posswap.patch(st.SentenceTransformer(str(root / "st"), device="cpu"), posswap.AlibiConfig(LENGTH))
    return st, root / "st", texts, reference.encode(texts, convert_to_tensor=True)


@pytest.mark.parametrize("shape", SHAPES)
def test_patch_of_a_sentence_transformer_writes_the_folder_meant(tiny_st, root, shape, capsys):
    st, source, texts, expected_embeddings = tiny_st
    given, expected = SHAPES[shape](root, "st")
    before = tree(root)
    args = ["patch", str(source), "--method", "alibi", "--max-length", str(LENGTH), "--out", given]
    assert main(args) == 0, capsys.readouterr().err
    assert (expected / "modules.json").is_file() and (expected / "config.json").is_file()
    assert_only_wrote(root, before, expected)
    loaded = posswap.from_pretrained(given)
    assert type(loaded) is st.SentenceTransformer and loaded.max_seq_length == LENGTH
    embeddings = loaded.encode(texts, convert_to_tensor=True)
    torch.testing.assert_close(embeddings, expected_embeddings, atol=1e-5, rtol=0)


# --- posswap train ---------------------------------------------------------------------------------------------


def recipe(base: Path, root: Path, output_dir: str | None) -> Path:
    """A tiny recipe, in a folder of an awkward name too; ``output_dir`` None: the recipe names a decoy, which
    ``--set`` must replace."""
    raw = {
        "model": str(base / "gpt2"),
        "posswap": {"method": "rope", "max_length": LENGTH},
        "data": {"train": str(base / "text.txt")},
        "train": {
            "output_dir": output_dir if output_dir is not None else str(root / "decoy"),
            "max_steps": 2,
            "batch_size": 1,
            "lr": 1e-3,
            "save_every": 2,
            "log_every": 1,
        },
    }
    path = root / "recette é" / "tiny recipe.yaml"
    path.parent.mkdir()
    path.write_text(json.dumps(raw, ensure_ascii=False), encoding="utf-8")  # JSON is YAML
    return path


TRAIN_CASES = [(shape, "set") for shape in SHAPES] + [(shape, "recipe") for shape in ("relative-dot-dot", "everything")]


@pytest.mark.parametrize("shape,how", TRAIN_CASES)
def test_train_writes_the_output_dir_meant(base, root, shape, how, capsys):
    """``train.output_dir`` from ``--set`` for every shape; from the recipe for a relative one (relative to the
    working folder, as the shipped recipes' ``out/...``) and for all at once."""
    given, expected = SHAPES[shape](root, "run")
    path = recipe(base, root, given if how == "recipe" else None)
    before = tree(root)
    overrides = ["--set", f"train.output_dir={given}"] if how == "set" else []
    assert main(["train", str(path), *overrides]) == 0, capsys.readouterr().err
    assert not (root / "decoy").exists()
    assert (expected / "log.jsonl").is_file() and (expected / "recipe.yaml").is_file()
    assert_only_wrote(root, before, expected)
    assert Path(json.loads((expected / "recipe.json").read_text())["train"]["output_dir"]) in (Path(given), expected)
    model = posswap.from_pretrained(str(expected / "model")).eval()
    assert model.config.posswap["method"] == "rope" and model.config.n_positions == LENGTH
    assert torch.isfinite(logits(model, IDS)).all()


# --- posswap eval ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_eval_writes_its_results_where_meant(base, patched_folder, root, shape, capsys):
    given, expected = SHAPES[shape](root, "report")
    before = tree(root)
    args = [
        "eval",
        f"{patched_folder}/",  # the model at an awkward path too
        "--data",
        str(base / "text.txt"),
        "--lengths",
        "32",
        str(LENGTH),
        "--max-tokens",
        "128",
        "--passkey-trials",
        "0",
        "--out",
        given,
    ]
    assert main(args) == 0, capsys.readouterr().err
    assert_only_wrote(root, before, expected)
    results = posswap.Results.load(expected / "results.json")
    assert results.lengths == [32, LENGTH] and list(results.models) == [patched_folder.name]
    assert all(v > 0 for v in results.models[patched_folder.name].metrics["ppl"])
    assert (expected / "ppl_vs_length.png").is_file()


# --- posswap export --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shape", SHAPES)
def test_export_writes_the_folder_meant(patched_folder, rope_reference, root, shape, capsys):
    given, expected = SHAPES[shape](root, "neox")
    before = tree(root)
    assert main(["export", str(patched_folder), "--out", given]) == 0, capsys.readouterr().err
    assert json.loads((expected / "config.json").read_text())["model_type"] == "gpt_neox"
    assert_only_wrote(root, before, expected)
    loaded = posswap.from_pretrained(given).eval()
    assert type(loaded).__name__ == "GPTNeoXForCausalLM"
    torch.testing.assert_close(logits(loaded, IDS), logits(rope_reference, IDS), atol=1e-4, rtol=0)


# --- posswap study ---------------------------------------------------------------------------------------------


def toy_preset(variants: tuple[str, ...]) -> copying.CopyingSpec:
    """The mini preset on the toy copier, trained in the work folder: two steps, one seed, no baseline."""
    return toy_spec(
        name="mini",
        variants=variants,
        steps=2,
        seeds=(0,),
        spans=2,
        baseline=False,
        shipped_copier=False,
        untrained_rows=(),
        schedules={},
    )


@pytest.mark.parametrize("shape", SHAPES)
def test_study_writes_its_work_and_results_where_meant(root, shape, monkeypatch, capsys):
    """``--preset mini`` (a toy in its place): the copier and the runs in --work, the report in --out; a second
    run finds its runs in the work folder."""
    variants = ("alibi",)
    monkeypatch.setitem(copying.COPYING_PRESETS, "mini", toy_preset(variants))
    work, expected_work = SHAPES[shape](root, "work")
    out, expected_out = SHAPES[shape](root, "results")
    before = tree(root)
    args = ["study", "--preset", "mini", "--work", work, "--out", out, "--jobs", "1"]
    assert main(args) == 0, capsys.readouterr().err
    assert_only_wrote(root, before, expected_work, expected_out)
    assert (expected_work / "copier" / "config.json").is_file()
    runs = [expected_work / "runs" / name / "seed0.json" for name in variants]
    assert all(run.is_file() for run in runs)
    results = json.loads((expected_out / "copying.json").read_text())
    assert set(results["runs"]) == set(variants)
    assert (expected_out / "summary.md").is_file() and (expected_out / "probe.png").is_file()
    assert posswap.from_pretrained(str(expected_work / "copier")).config.n_positions == toy_spec().copier.length
    stamps = [run.stat().st_mtime_ns for run in runs]
    assert main(args) == 0, capsys.readouterr().err
    assert [run.stat().st_mtime_ns for run in runs] == stamps  # found again: the same folder
    assert_only_wrote(root, before, expected_work, expected_out)


def test_the_shapes_name_distinct_folders(tmp_path):
    """The cases are what they claim: every path has its shape, and the folders meant differ."""
    given = {name: shape(tmp_path, "x") for name, shape in SHAPES.items()}
    assert ".." in given["dot-dot"][0] and given["relative-dot-dot"][0].startswith("../")
    assert " " in given["spaces"][0] and "ü" in given["unicode"][0] and given["trailing-slash"][0].endswith("/")
    assert all(s in given["everything"][0] for s in ("..", " ", "ü")) and given["everything"][0].endswith("/")
    for name, (path, expected) in given.items():
        if name != "relative-dot-dot":
            assert Path(os.path.normpath(path)) == expected
