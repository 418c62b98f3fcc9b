"""Issue 28: the embedding recipe (recipes/minilm-embed-2k.yaml on the real MiniLM, made tiny with --set) killed
with SIGKILL part-way, and every bad value of the keys it reads refused before any work.

An embedding recipe keeps no checkpoints (sentence-transformers' trainer would pickle its optimizer; posswap writes
safetensors only): ``--resume`` is refused with one line that says to run it again, and ``train.save_every`` is
refused as a key it does not use. So the way back from a kill is that second run, in the same folder: it must give
the weights and the log of an uninterrupted run with the same seed in another folder (the independent reference),
bit for bit, and nothing the killed run wrote may be lost or contradicted on the way."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import posswap.embeddings.training.trainer as embedding_training
from posswap.cli import main
from posswap.embeddings.training.recipe import EmbeddingSpec
from posswap.training.recipe import DataSpec, TrainSpec

pytest.importorskip("sentence_transformers")
pytestmark = pytest.mark.filterwarnings("ignore::FutureWarning", "ignore::DeprecationWarning")

RECIPE = Path(__file__).parents[1] / "recipes" / "minilm-embed-2k.yaml"
STEPS = 6
# The shipped recipe (MiniLM patched to 2048, stride placement with exact short inputs, cached MNRL, dropout 0) at a
# few seconds' size (one run of its soup), with a teacher added (the recipe has none) so that resuming covers its dataset too.
TINY = [
    f"train.max_steps={STEPS}",
    "train.batch_size=4",
    "embedding.document_lengths=[64,128]",
    "embedding.pairs=8",
    "embedding.anchor_words=8",
    "embedding.mini_batch_size=4",
    "embedding.teacher=4",  # one batch of the teacher's texts beside the two of pairs
    "embedding.chunk_teacher=4",  # and one of the chunk teacher's documents (the recipe's 64 would be 16 batches)
    "embedding.soup=1",  # one run of the four the recipe averages (the soup: test_embedding_training)
    "data.train=posswap:austen-heldout",  # one novel: a fifth of the tokenising
]
# One thread each: the two first runs share the 2 cores, and every run reduces in the same order (bitwise equal).
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


# ``posswap train`` killed (SIGKILL) as it writes the trained weights into the model folder's staging folder.
KILLED_IN_SAVE = textwrap.dedent("""
    import os, signal, sys
    import transformers.modeling_utils
    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)
    transformers.modeling_utils.safe_save_file = killed
    from posswap.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def start(run_dir: Path, logs: Path, *extra: str, script: str | None = None) -> subprocess.Popen:
    """``posswap train`` of the tiny recipe into ``run_dir`` (by ``script`` if given); its output goes to files."""
    python = [sys.executable, "-c", script] if script else [sys.executable, "-m", "posswap"]
    command = [*python, "train", str(RECIPE), "--set", f"train.output_dir={run_dir}", *TINY, *extra]
    out, err = open(logs.with_suffix(".out"), "w"), open(logs.with_suffix(".err"), "w")
    with out, err:
        return subprocess.Popen(command, stdout=out, stderr=err, env=ENV, cwd=logs.parent)


def finish(process: subprocess.Popen, logs: Path) -> None:
    assert process.wait(timeout=300) == 0, logs.with_suffix(".err").read_text()[-3000:]


def log_lines(run_dir: Path) -> list[str]:
    """The complete lines of the run's log.jsonl (a line being written is not one yet)."""
    path = run_dir / "log.jsonl"
    text = path.read_text() if path.is_file() else ""
    return text.splitlines()[: text.count("\n")]


def kill_after_step(process: subprocess.Popen, run_dir: Path, step: int) -> None:
    """SIGKILL once ``step`` optimizer steps are in the log, while the run is still training."""
    deadline = time.monotonic() + 240
    while len(log_lines(run_dir)) < step:
        assert process.poll() is None, "the run ended before it could be killed"
        assert time.monotonic() < deadline, "no training step was logged in time"
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL  # killed, not finished in the meantime


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def weights(model_dir: Path) -> dict[str, torch.Tensor]:
    shards = sorted(model_dir.rglob("*.safetensors"))
    assert shards, f"no weights in {model_dir}"
    return {f"{p.relative_to(model_dir)}:{k}": v for p in shards for k, v in load_file(p).items()}


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run, with the same seed, in a folder of its own: started at once (beside the first killed
    run), ``reference()`` waits for it and gives its folder."""
    folder = tmp_path_factory.mktemp("reference")
    process = start(folder / "run", folder / "log")

    def finished() -> Path:
        finish(process, folder / "log")
        return folder / "run"

    yield finished
    if process.poll() is None:
        process.kill()
        process.wait()


def test_a_killed_embedding_run_run_again_gives_the_uninterrupted_weights(tmp_path, capsys, minilm_path, reference):
    run = tmp_path / "run"
    killed = start(run, tmp_path / "killed-log")
    kill_after_step(killed, run, 2)
    uninterrupted = reference()

    # What the kill left: the recipe and the log of the steps done; no model folder, not even a part of one.
    left = files(run)
    assert {"recipe.yaml", "recipe.json", "log.jsonl"} <= set(left) and not (run / "model").exists()
    before = [json.loads(line) for line in log_lines(run)]
    assert [line["step"] for line in before] == list(range(1, len(before) + 1)) and 2 <= len(before) < STEPS

    # --resume: one line, before any work (no checkpoint to resume from), and the folder as the kill left it.
    assert main(["train", str(RECIPE), "--set", f"train.output_dir={run}", *TINY, "--resume"]) == 2
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        "posswap train: error: --resume / --force: an embedding recipe keeps no checkpoints to resume; run it again."
    ]
    assert files(run) == left

    # Run again in the same folder (the killed run's lock is stale): it finishes.
    again = start(run, tmp_path / "again-log")
    finish(again, tmp_path / "again-log")

    trained, expected = weights(run / "model"), weights(uninterrupted / "model")
    assert trained.keys() == expected.keys()
    different = [k for k in expected if not torch.equal(trained[k], expected[k])]
    assert different == [], f"weights differ from the uninterrupted run: {different[:5]}"
    # The reference trained (equal weights are not two copies of the untouched model).
    base = load_file(Path(minilm_path) / "model.safetensors")
    query = "encoder.layer.0.attention.self.query.weight"
    assert not torch.equal(expected[f"model.safetensors:{query}"], base[query])

    # Nothing the killed run wrote is lost or contradicted: its steps are the first lines of the log, value for
    # value, as they are of the uninterrupted run's; the recipe files are the same bytes.
    after = [json.loads(line) for line in log_lines(run)]
    assert after == [json.loads(line) for line in log_lines(uninterrupted)]
    assert [line["step"] for line in after] == list(range(1, STEPS + 1)) and after[: len(before)] == before
    now = files(run)
    assert all(now[name] == left[name] for name in ("recipe.yaml", "recipe.json"))
    assert not (run / "trainer").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []  # no lock left beside


def test_a_run_killed_while_it_saves_leaves_the_earlier_model_whole(tmp_path, minilm_path, reference):
    """A run with --overwrite over an earlier run folder, killed as it writes the new weights: the earlier folder
    stays as it was, byte for byte (its model, and the recipe and log that describe it: issue 45), and the next run
    clears what the killed one left and gives the reference."""
    run = tmp_path / "run"
    shutil.copytree(minilm_path, run / "model")  # the earlier model: MiniLM itself, with an earlier run's record
    (run / "recipe.yaml").write_text("train:\n  seed: 7\n")
    (run / "recipe.json").write_text('{"train": {"seed": 7, "lr": 0.5}}\n')
    (run / "log.jsonl").write_text('{"step": 1, "loss": 0.5}\n{"step": 2, "loss": 0.25}\n')
    earlier = files(run)
    killed = start(run, tmp_path / "killed-log", "--overwrite", script=KILLED_IN_SAVE)
    assert killed.wait(timeout=300) == -signal.SIGKILL, (tmp_path / "killed-log.err").read_text()[-3000:]
    assert len(log_lines(run / ".posswap-pending")) == STEPS  # it had trained: killed in the save, not before
    assert {name: data for name, data in files(run).items() if not name.startswith(".posswap-pending/")} == earlier
    left = sorted(p.name for p in run.iterdir() if p.name not in ("model", "log.jsonl", "recipe.yaml", "recipe.json"))
    assert left == [".posswap-pending"]  # the killed run: its record and its model's staging folder
    finish(start(run, tmp_path / "again-log", "--overwrite"), tmp_path / "again-log")
    assert sorted(p.name for p in run.iterdir()) == ["log.jsonl", "model", "recipe.json", "recipe.yaml"]
    trained, expected = weights(run / "model"), weights(reference() / "model")
    assert trained.keys() == expected.keys() and all(torch.equal(trained[k], expected[k]) for k in expected)


# -- every key the embedding recipe reads: a bad value is one line naming the key, before any work ----------------

BAD = [
    # embedding: (its EmbeddingSpec)
    ("embedding.document_lengths=[]", "embedding.document_lengths must be a non-empty list"),
    ("embedding.document_lengths=512", "embedding.document_lengths must be a non-empty list"),
    ("embedding.document_lengths=[64,-1]", "embedding.document_lengths entries must be a positive integer"),
    ("embedding.document_lengths=[64.5]", "embedding.document_lengths entries must be a positive integer"),
    ("embedding.document_lengths=[4096]", "embedding.document_lengths entry 4096 is longer than posswap.max_length"),
    ("embedding.document_lengths=[16]", "embedding.document_lengths entry 16 is shorter than twice"),
    ("embedding.pairs=0", "embedding.pairs must be a positive integer"),
    ("embedding.pairs=ten", "embedding.pairs must be a positive integer"),
    ("embedding.pairs=true", "embedding.pairs must be a positive integer"),
    ("embedding.pairs=4", "embedding.pairs (4) is fewer than one optimizer step"),
    ("embedding.anchor_words=0", "embedding.anchor_words must be a positive integer"),
    ("embedding.soup=0", "embedding.soup must be a positive integer"),
    ("embedding.soup=2.5", "embedding.soup must be a positive integer"),
    ("embedding.anchor_words=2.5", "embedding.anchor_words must be a positive integer"),
    ("embedding.anchor_words=300", "shorter than twice embedding.anchor_words (300)"),
    ("embedding.hard_negatives=maybe", "embedding.hard_negatives must be true or false"),
    ("embedding.hard_negatives=1", "embedding.hard_negatives must be true or false"),
    ("embedding.loss=triplet", "embedding.loss must be one of 'cached_mnrl', 'mnrl'"),
    ("embedding.loss=MNRL", "embedding.loss must be one of 'cached_mnrl', 'mnrl'"),
    ("embedding.loss=null", "embedding.loss must be one of 'cached_mnrl', 'mnrl'"),
    ("embedding.mini_batch_size=0", "embedding.mini_batch_size must be a positive integer"),
    ("embedding.mini_batch_size=1.5", "embedding.mini_batch_size must be a positive integer"),
    ("embedding.loss=mnrl embedding.mini_batch_size=4", "embedding.mini_batch_size (4) applies to loss cached_mnrl"),
    ("embedding.scale=0", "embedding.scale must be a number > 0"),
    ("embedding.scale=.nan", "embedding.scale must be a finite number > 0"),
    ("embedding.scale=.inf", "embedding.scale must be a finite number > 0"),
    ("embedding.scale=big", "embedding.scale must be a number > 0"),
    ("embedding.dropout=1", "embedding.dropout must be a number >= 0 and < 1"),
    ("embedding.dropout=-0.1", "embedding.dropout must be a number >= 0 and < 1"),
    ("embedding.dropout=half", "embedding.dropout must be a number >= 0 and < 1"),
    ("embedding.teacher=-1", "embedding.teacher must be a whole number of texts >= 0"),
    ("embedding.teacher=true", "embedding.teacher must be a whole number of texts >= 0"),
    ("embedding.teacher=2.5", "embedding.teacher must be a whole number of texts >= 0"),
    ("posswap=null embedding.teacher=8", "embedding.teacher needs a posswap: block"),
    ("embedding.chunk_teacher=-1", "embedding.chunk_teacher must be a whole number of texts >= 0"),
    ("embedding.chunk_teacher=true", "embedding.chunk_teacher must be a whole number of texts >= 0"),
    ("embedding.chunk_teacher=2.5", "embedding.chunk_teacher must be a whole number of texts >= 0"),
    ("posswap=null embedding.teacher=0 embedding.chunk_teacher=8", "embedding.chunk_teacher needs a posswap: block"),
    ("embedding.context_pairs=-1", "embedding.context_pairs must be a whole number of texts >= 0"),
    ("embedding.context_pairs=2.5", "embedding.context_pairs must be a whole number of texts >= 0"),
    ("embedding.context_lengths=[100]", "embedding.context_lengths entry 100 holds fewer than three chunks"),
    ("embedding.context_lengths=[8192]", "embedding.context_lengths entry 8192 is longer than posswap.max_length"),
    ("embedding.context_lengths=5", "embedding.context_lengths must be a non-empty list"),
    ("embedding.context_chunk_tokens=0", "embedding.context_chunk_tokens must be a positive integer"),
    ("embedding.context_source=nature", "embedding.context_source must be one of 'templates', 'natural', 'both'"),
    ("embedding.context_source=natural", "embedding.context_source (natural) says what the context pairs are"),
    ("embedding.context_haystacks=[emma]", "and embedding.context_pairs is 0"),
    ("embedding.context_pairs=8 embedding.context_haystacks=[persuasion]", "is a haystack the context task holds out"),
    ("embedding.context_pairs=8 embedding.context_haystacks=[nothing]", "'nothing' is not an embedded text"),
    ("embedding.context_copy_margin=0.05", "embedding.context_copy_margin (0.05) applies to natural context pairs"),
    ("embedding.context_copy_margin=-1", "embedding.context_copy_margin must be a number <= 2 and > 0"),
    ("embedding.pairz=3", "Unknown key(s) in embedding: pairz"),
    ("embedding=5", "embedding must be a mapping"),
    # train: what sentence-transformers' trainer and the optimizer read
    ("train.output_dir=null", "train.output_dir must be a non-empty string"),
    ("train.max_steps=0", "train.max_steps must be a positive integer"),
    ("train.batch_size=two", "train.batch_size must be a positive integer"),
    ("train.batch_size=1", "train.batch_size (1) must be at least 2 for an embedding recipe"),
    ("train.grad_accum=0", "train.grad_accum must be a positive integer"),
    ("train.lr=0", "train.lr must be a number > 0"),
    ("train.lr=-1e-4", "train.lr must be a number > 0"),
    ("train.position_lr=0", "train.position_lr must be a number > 0"),
    ("train.weight_decay=-1", "train.weight_decay must be a number >= 0"),
    ("train.warmup_steps=1.5", "train.warmup_steps must be an integer >= 0"),
    ("train.mixed_precision=bf16", "train.mixed_precision (embedding recipe) must be one of 'no'"),
    ("train.mixed_precision=fp8", "train.mixed_precision must be one of"),
    ("train.gradient_checkpointing=maybe", "train.gradient_checkpointing must be true or false"),
    ("train.trainable=lora", "train.trainable (embedding recipe) must be one of 'full', 'positions'"),
    ("train.trainable=everything", "train.trainable must be one of"),
    ("train.train_norms=2", "train.train_norms must be true or false"),
    ("train.log_every=0", "train.log_every must be a positive integer"),
    ("train.seed=-1", "train.seed must be an integer >= 0"),
    # train: keys only the MLM/CLM loop reads (the checkpoint keys among them) are refused, not ignored
    ("train.save_every=1", "train.save_every is not used by an embedding recipe"),
    ("train.keep_checkpoints=1", "train.keep_checkpoints is not used by an embedding recipe"),
    ("train.mlm_probability=0.3", "train.mlm_probability is not used by an embedding recipe"),
    ("train.pose_window=128", "train.pose_window is not used by an embedding recipe"),
    ("train.curriculum=[256,512]", "train.curriculum is not used by an embedding recipe"),
    ("train.lora.r=4", "train.lora is not used by an embedding recipe"),
    ("train.distill.weight=1", "train.distill is for the MLM/CLM loop"),  # embedding.teacher is its mechanism
    # data
    ("data.train=posswap:nope", "data.train: no embedded split 'posswap:nope'"),
    ("data.text_column=body", "data.text_column: 'posswap:austen-train' has one text column, 'text'"),
    ("data.streaming=true", "data.streaming is not used by an embedding recipe"),
    ("data.repeat_fraction=0.5", "data.repeat_fraction is not used by an embedding recipe"),
    ("data.repeat_span=8", "data.repeat_span is not used by an embedding recipe"),
    # blocks an embedding recipe does not read
    ("tokenizer=bert-base-uncased", "tokenizer: an embedding recipe uses the sentence-transformers model's own"),
    ("eval.lengths=[256]", "eval.lengths: the eval block runs the MLM/CLM harness"),
]
NAMED = {
    "train.lora.r": "train.lora",
    "train.distill.weight": "train.distill",
    "embedding.pairz": "embedding: pairz",
}  # how the message names the key


@pytest.fixture
def no_work(monkeypatch):
    """Loading the model is where the work starts: a bad value that got this far fails the test at once."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded: the bad value was not refused before work")

    monkeypatch.setattr(embedding_training, "load_sentence_model", loaded)


@pytest.mark.parametrize("overrides,message", BAD, ids=[o for o, _ in BAD])
def test_a_bad_value_is_one_line_naming_the_key_before_any_work(tmp_path, capsys, no_work, overrides, message):
    out = tmp_path / "out"
    started = time.monotonic()
    code = main(["train", str(RECIPE), "--set", f"train.output_dir={out}", *overrides.split(" ")])
    took = time.monotonic() - started
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("posswap train: error: "), captured.err
    assert message in lines[0], lines[0]
    key = overrides.split(" ")[-1].partition("=")[0]
    assert NAMED.get(key, key) in lines[0], lines[0]
    assert captured.out == "" and list(tmp_path.iterdir()) == []  # no output folder, no lock file beside it
    assert took < 10, f"refused after {took:.1f} s"


def test_the_bad_values_cover_every_key_the_embedding_recipe_reads():
    """A key added to embedding:, train: or data: needs its bad value above."""
    covered = {o.split(" ")[-1].partition("=")[0] for o, _ in BAD}
    keys = {f"embedding.{f.name}" for f in dataclasses.fields(EmbeddingSpec)}
    keys |= {f"train.{f.name}" for f in dataclasses.fields(TrainSpec)}
    keys |= {f"data.{f.name}" for f in dataclasses.fields(DataSpec)}
    missing = {k for k in keys if not any(c == k or c.startswith(k + ".") for c in covered)}
    assert missing == set()
