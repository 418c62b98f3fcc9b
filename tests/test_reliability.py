"""Issue 22, third round: each case is an input that used to pass silently or end in a traceback, and what it must
give now.

- two writers of one folder (``posswap patch --out``, ``write_folder``): the second is refused in one line while the
  first holds the folder's lock; a lock a killed writer left is neither a user's file nor a block;
- two ``posswap train`` on one ``output_dir``: the second is refused at once, naming the folder and the pid;
- ``save_pretrained`` of a patched model killed part-way over an earlier folder: the earlier folder stays whole
  (for models patched here and for models loaded with ``trust_remote_code`` where posswap is not installed);
- KV cache with ``position_ids`` that jump: the full pass with the same ids, for every method;
- hand-edited ``posswap`` blocks in config.json: one line naming folder, block and key, with posswap and without;
- ``position_ids`` of the wrong length: a ValueError naming both lengths, for every method;
- a tokenizer larger than the model's vocabulary, YAML alias bombs and long values, a Hub that never answers or
  cannot be reached, links leaving a pushed folder, a refused push, an unwritable final model folder, a push failing
  after training, unreadable data files, a full disk, a tokenizer mapped to custom code, the meta device.

Concurrency is made deterministic with events: the first writer holds the lock (paused inside its write), then
the second starts and must be refused.
"""

from __future__ import annotations

import inspect
import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from conftest import WITHOUT_POSSWAP, sharpen_qk
from test_common import FACTORIES
from transformers import GPT2Model

import posswap
from posswap.cli import main
from posswap.files import LOCK, hold, lock_path, write_folder

OLD, NEW = 64, 128


def tiny(arch: str = "gpt2", seed: int = 0):
    torch.manual_seed(seed)
    if arch == "gpt2":
        config = transformers.GPT2Config(
            n_layer=2, n_embd=64, n_head=4, n_positions=OLD, vocab_size=99, bos_token_id=98, eos_token_id=98
        )
        return sharpen_qk(transformers.GPT2LMHeadModel(config).eval())
    if arch == "roberta":
        config = transformers.RobertaConfig(
            vocab_size=99,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=64,
            pad_token_id=1,
            max_position_embeddings=OLD + 2,
        )
        return sharpen_qk(transformers.RobertaForMaskedLM(config).eval())
    config = transformers.BertConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=OLD,
    )
    return sharpen_qk(transformers.BertForMaskedLM(config).eval())


def patched(method: str, arch: str = "gpt2", seed: int = 0):
    model = tiny(arch, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # NoPE on an encoder warns
        posswap.patch(model, FACTORIES[method](NEW))
    return scrambled(model)


def scrambled(model):
    with torch.no_grad():  # parameters that start at zero (TUPE-R's buckets) would hide their positions
        for param in (
            p for provider in getattr(model.base_model, "posswap_bias_providers", []) for p in provider.parameters()
        ):
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)))
    return model


def ids(length: int, batch: int = 1, seed: int = 1) -> torch.Tensor:
    return torch.randint(3, 99, (batch, length), generator=torch.Generator().manual_seed(seed))


def logits(model, tokens, **kwargs) -> torch.Tensor:
    with torch.no_grad():
        out = model(input_ids=tokens, **kwargs)
    return out.logits


def one_line_error(code: int, err: str, expected: str) -> str:
    lines = [
        line for line in err.strip().splitlines() if line.strip() and "%|" not in line
    ]  # transformers' progress bars
    assert code == 2 and "Traceback" not in err and len(lines) == 1 and lines[0].startswith("posswap "), err
    assert expected in lines[0], err
    return lines[0]


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if "posswap-" in p.name)


@pytest.fixture(scope="module")
def base_folder(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("base") / "gpt2"
    tiny().save_pretrained(folder)
    return folder


# -- item 2: two writers of one folder ----------------------------------------------------------------------


def test_a_second_writer_of_one_folder_is_refused_while_the_first_writes(base_folder, tmp_path, capsys):
    """The first writer (paused inside its write, holding the folder) keeps its output; `posswap patch --out` to
    the same folder is refused in one line instead of both exiting 0 with one of the two outputs left."""
    out = tmp_path / "out"
    writing, finish, done = threading.Event(), threading.Event(), []

    def slow_write(folder: Path) -> None:
        (folder / "config.json").write_text('{"first": true}')
        writing.set()
        assert finish.wait(120)

    first = threading.Thread(target=lambda: done.append(write_folder(out, slow_write)))
    first.start()
    try:
        assert writing.wait(120)
        capsys.readouterr()
        code = main(["patch", str(base_folder), "--method", "alibi", "--max-length", str(NEW), "--out", str(out)])
        line = one_line_error(
            code, capsys.readouterr().err, "is writing that folder now; wait for it to finish, or choose another folder"
        )
        assert f"--out {out}" in line and f"pid {os.getpid()}" in line
    finally:
        finish.set()
        first.join()
    assert done == [out] and json.loads((out / "config.json").read_text()) == {"first": True}
    assert leftovers(tmp_path) == []  # the lock file goes with its holder


def test_a_writer_in_another_process_holds_the_folder(base_folder, tmp_path):
    """The lock is a file lock: a `posswap patch` process is refused while another process holds the folder, and
    the message names that process."""
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            textwrap.dedent(f"""
            import sys
            from pathlib import Path
            from posswap.files import hold
            with hold(Path({str(out)!r}), "posswap patch", str):
                print("held", flush=True)
                sys.stdin.read()
        """),
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        second = subprocess.run(
            [
                sys.executable,
                "-m",
                "posswap",
                "patch",
                str(base_folder),
                "--method",
                "rope",
                "--max-length",
                str(NEW),
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        one_line_error(
            second.returncode,
            second.stderr,
            f"another posswap process (pid {holder.pid}, posswap patch) is writing that folder now",
        )
        assert not out.exists()
    finally:
        holder.stdin.close()
        holder.wait(60)
    assert leftovers(tmp_path) == []


def test_a_lock_a_killed_writer_left_is_no_block_and_no_users_file(base_folder, tmp_path):
    """A lock file nobody holds (its writer was killed): the next writer takes the folder; the folder that holds it
    still counts as empty, and the stale lock is removed with the write."""
    parent = tmp_path / "parent"
    parent.mkdir()
    (parent / f".child.{LOCK}").write_text('{"pid": 1, "by": "posswap patch"}')  # a lock of parent/child, not held
    (tmp_path / f".out.{LOCK}").write_text('{"pid": 1, "by": "posswap patch"}')
    assert (
        main(["patch", str(base_folder), "--method", "rope", "--max-length", str(NEW), "--out", str(tmp_path / "out")])
        == 0
    )
    assert main(["patch", str(base_folder), "--method", "rope", "--max-length", str(NEW), "--out", str(parent)]) == 0
    assert (parent / "config.json").is_file() and not (parent / f".child.{LOCK}").exists()
    assert leftovers(tmp_path) == []


# -- item 3: two runs on one output_dir ----------------------------------------------------------------------


def test_a_second_train_on_one_output_dir_is_refused_at_once(bases, tmp_path, capsys):
    from test_training import make_raw, run

    run_dir = tmp_path / "run"
    raw = make_raw(bases, run_dir, max_steps=3, save_every=2)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(raw))
    paused, resume, errors = threading.Event(), threading.Event(), []

    def pause_at_the_first_step(step, loss, model):  # before it: the second run finds no checkpoint either
        if step == 1:
            paused.set()
            assert resume.wait(300)

    def first_run():
        try:
            run(raw, callbacks=[pause_at_the_first_step])
        except BaseException as error:  # reported below, in the test's thread
            errors.append(error)
            paused.set()

    first = threading.Thread(target=first_run)
    first.start()
    try:
        assert paused.wait(600) and not errors
        before = sorted(p.name for p in run_dir.iterdir())
        capsys.readouterr()  # the first run's progress bars
        code = main(["train", str(recipe)])
        one_line_error(
            code,
            capsys.readouterr().err,
            f"another posswap train is using {run_dir} (pid {os.getpid()}); wait for it or choose another train.output_dir.",
        )
        assert sorted(p.name for p in run_dir.iterdir()) == before  # the second run wrote nothing there
    finally:
        resume.set()
        first.join()
    assert errors == []
    assert posswap.from_pretrained(str(run_dir / "model")).config.posswap["method"] == "rope"
    assert [json.loads(line)["step"] for line in (run_dir / "log.jsonl").read_text().splitlines()] == [1, 2, 3]
    assert leftovers(tmp_path) == []
    assert main(["train", str(recipe), "--resume"]) == 0  # once the first has finished, the folder is free


# -- item 4: save_pretrained killed part-way -------------------------------------------------------------------

KILLED_SAVE = textwrap.dedent("""
    import importlib.abc, json, os, signal, sys
    job = json.loads(sys.argv[1])
    if job["writer"] == "remote-code":
        class NoPosswap(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path, target=None):
                if name == "posswap" or name.startswith("posswap."):
                    raise ImportError("posswap is not installed here")
        sys.meta_path.insert(0, NoPosswap())
    import transformers, transformers.modeling_utils
    if job["writer"] == "remote-code":  # the saved ALiBi folder, with the code it carries
        model = transformers.AutoModelForCausalLM.from_pretrained(job["source"], trust_remote_code=True)
    else:  # a stock model patched here: it keeps its class, GPT2LMHeadModel
        import posswap
        model = posswap.patch(transformers.GPT2LMHeadModel.from_pretrained(job["plain"]), posswap.AlibiConfig(max_length=128))
    def killed(*args, **kwargs):  # as a kill -9 while the weights are written
        os.kill(os.getpid(), signal.SIGKILL)
    transformers.modeling_utils.safe_save_file = killed
    model.save_pretrained(job["target"])
""")


@pytest.mark.parametrize("writer", ["posswap", "remote-code"])
def test_a_save_killed_part_way_leaves_the_earlier_folder_whole(tmp_path, writer):
    """An ALiBi model saved over a RoPE folder and killed while its weights are written: before, the folder held the
    ALiBi config.json over the RoPE weights, and loaded without a word."""
    rope, alibi = patched("rope"), patched("alibi", seed=1)
    out, source = tmp_path / "out", tmp_path / "alibi"
    rope.save_pretrained(out)
    (out / "tokenizer_config.json").write_text("{}")  # a file of the user's beside the model
    alibi.save_pretrained(source)
    tiny().save_pretrained(tmp_path / "plain")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    job = json.dumps({"writer": writer, "source": str(source), "plain": str(tmp_path / "plain"), "target": str(out)})
    killed = subprocess.run(
        [sys.executable, "-c", KILLED_SAVE, job], capture_output=True, text=True, env=env, timeout=600
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    loaded = posswap.from_pretrained(str(out))
    assert loaded.config.posswap["method"] == "rope"
    tokens = ids(40)
    assert torch.equal(logits(loaded, tokens), logits(rope, tokens))
    # The next save cleans what the killed one left beside the folder, and replaces the folder whole.
    assert leftovers(tmp_path) != []
    alibi.save_pretrained(out)
    assert leftovers(tmp_path) == [] and (out / "tokenizer_config.json").read_text() == "{}"
    assert torch.equal(logits(posswap.from_pretrained(str(out)), tokens), logits(alibi, tokens))


def test_save_over_a_folder_keeps_the_users_files_and_drops_old_weights(tmp_path):
    out = tmp_path / "out"
    patched("rope").save_pretrained(out)
    (out / "notes.txt").write_text("mine\n")
    (out / "tokenizer").mkdir()
    (out / "tokenizer" / "vocab.txt").write_text("a\nb\n")
    (out / "model-00001-of-00002.safetensors").write_bytes(b"old shard")  # weights of an earlier, sharded save
    alibi = patched("alibi", seed=1)
    alibi.save_pretrained(out)
    names = sorted(p.name for p in out.iterdir())
    assert "model-00001-of-00002.safetensors" not in names and "model.safetensors" in names
    assert (out / "notes.txt").read_text() == "mine\n" and (out / "tokenizer" / "vocab.txt").read_text() == "a\nb\n"
    tokens = ids(40)
    assert torch.equal(logits(posswap.from_pretrained(str(out)), tokens), logits(alibi, tokens))
    assert leftovers(tmp_path) == []


def test_save_into_a_mounted_folder_replaces_its_files_config_last(tmp_path, monkeypatch):
    """A mount point cannot be renamed: the save is staged inside it and moved in file by file, config.json last; a
    save that fails while staging leaves the folder as it was."""
    import transformers.modeling_utils

    out = tmp_path / "mounted"
    rope, alibi = patched("rope"), patched("alibi", seed=1)
    rope.save_pretrained(out)
    (out / "notes.txt").write_text("mine\n")
    real_ismount = os.path.ismount
    monkeypatch.setattr(os.path, "ismount", lambda path: str(path) == str(out) or real_ismount(path))
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    with monkeypatch.context() as m:
        m.setattr(
            transformers.modeling_utils, "safe_save_file", lambda *a, **k: (_ for _ in ()).throw(OSError("disk full"))
        )
        with pytest.raises(OSError, match="disk full"):
            alibi.save_pretrained(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    alibi.save_pretrained(out)
    tokens = ids(30)
    assert torch.equal(logits(posswap.from_pretrained(str(out)), tokens), logits(alibi, tokens))
    assert (out / "notes.txt").read_text() == "mine\n" and leftovers(out) == [] and leftovers(tmp_path) == []


def test_save_into_the_working_folder(tmp_path, monkeypatch):
    out = tmp_path / "out"
    patched("rope").save_pretrained(out)
    monkeypatch.chdir(out)
    alibi = patched("alibi", seed=1)
    alibi.save_pretrained(".")
    assert Path.cwd() == out and Path("config.json").is_file()  # the process is in the new folder, not a removed one
    assert posswap.from_pretrained(".").config.posswap["method"] == "alibi"


def test_save_pretrained_is_refused_while_another_writer_holds_the_folder(tmp_path):
    out = tmp_path / "out"
    model = patched("t5-bias")
    with hold(out, "posswap patch", str):
        with pytest.raises(
            ValueError,
            match=rf"save_pretrained\('{re.escape(str(out))}'\): another posswap process \(pid {os.getpid()}, posswap patch\) is writing",
        ):
            model.save_pretrained(out)
    assert not out.exists() and not lock_path(out).exists()


def test_copies_save_themselves(tmp_path):
    import copy
    import pickle

    model = patched("alibi")
    for name, twin in (("deepcopy", copy.deepcopy(model)), ("pickle", pickle.loads(pickle.dumps(model)))):
        with torch.no_grad():
            twin.lm_head.weight.mul_(2)  # tied to the token embeddings: the copy differs from the original
        twin.save_pretrained(tmp_path / name)
        assert torch.equal(logits(posswap.from_pretrained(str(tmp_path / name)), ids(20)), logits(twin, ids(20)))


# -- item 5: KV cache with position ids that jump ----------------------------------------------------------------


# transformers 5.24 renamed the cache argument to ``cache`` and still takes ``past_key_values``: the hooks read both.
CACHE_NAMES = ["past_key_values"] + (["cache"] if "cache" in inspect.signature(GPT2Model.forward).parameters else [])


@pytest.mark.parametrize("cache_name", CACHE_NAMES)
@pytest.mark.parametrize("method", FACTORIES)
def test_cached_keys_keep_their_positions_when_the_ids_jump(method, cache_name):
    """10 tokens cached, then 5 at positions 100..104: the logits of one full pass with the same position ids (ALiBi,
    T5 bias and TUPE numbered the cached keys back from 100 and differed by 0.25 / 0.21 / 2.9e-3)."""
    model = patched(method)
    tokens = ids(15)
    positions = torch.cat([torch.arange(10), torch.arange(100, 105)])[None]
    full = logits(model, tokens, position_ids=positions)
    with torch.no_grad():
        prefix = model(input_ids=tokens[:, :10], use_cache=True)
        step = model(input_ids=tokens[:, 10:], position_ids=positions[:, 10:], **{cache_name: prefix.past_key_values})
        last = model(input_ids=tokens[:, :1], position_ids=torch.tensor([[110]]), **{cache_name: step.past_key_values})
    torch.testing.assert_close(prefix.logits, full[:, :10], atol=1e-5, rtol=0)
    torch.testing.assert_close(step.logits, full[:, 10:], atol=1e-5, rtol=0)
    longer = torch.cat([tokens, tokens[:, :1]], dim=1)
    expected = logits(model, longer, position_ids=torch.cat([positions, torch.tensor([[110]])], dim=1))[:, -1:]
    torch.testing.assert_close(last.logits, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["alibi", "t5-bias", "tupe"])
def test_a_roberta_decoder_counts_its_ids_from_the_padding_offset(method):
    """RoBERTa's ids start at padding_idx + 1 = 2: a first call without ids and a second with explicit ids that jump
    give the full pass with ids 2 + [0..9, 100..104]."""
    torch.manual_seed(0)
    config = transformers.RobertaConfig(
        vocab_size=99,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=64,
        pad_token_id=1,
        max_position_embeddings=OLD + 2,
        is_decoder=True,
    )
    model = scrambled(posswap.patch(sharpen_qk(transformers.RobertaForCausalLM(config).eval()), FACTORIES[method](NEW)))
    tokens, positions = ids(15), 2 + torch.cat([torch.arange(10), torch.arange(100, 105)])[None]
    full = logits(model, tokens, position_ids=positions)
    with torch.no_grad():
        prefix = model(input_ids=tokens[:, :10], use_cache=True)
        step = model(input_ids=tokens[:, 10:], position_ids=positions[:, 10:], past_key_values=prefix.past_key_values)
    torch.testing.assert_close(torch.cat([prefix.logits, step.logits], dim=1), full, atol=1e-5, rtol=0)


@pytest.mark.parametrize("method", ["alibi", "t5-bias", "tupe"])
def test_a_cropped_cache_and_a_cache_of_unknown_positions(method):
    """A cropped cache (assisted decoding) keeps the positions of the keys it keeps. A cache whose key positions
    were not recorded (filled by other code) takes ids that continue it, and refuses ids that jump."""
    from posswap.portable.posswap_attention import KEY_POSITIONS

    model = patched(method)
    tokens = ids(14)
    positions = torch.cat([torch.arange(6), torch.arange(50, 58)])[None]
    with torch.no_grad():
        cache = model(input_ids=tokens[:, :8], position_ids=positions[:, :8], use_cache=True).past_key_values
        cache.crop(-2)  # the last two keys go, as assisted decoding drops rejected tokens
        step = model(input_ids=tokens[:, 6:], position_ids=positions[:, 6:], past_key_values=cache)
    torch.testing.assert_close(step.logits, logits(model, tokens, position_ids=positions)[:, 6:], atol=1e-5, rtol=0)
    with torch.no_grad():
        cache = model(input_ids=tokens[:, :6], use_cache=True).past_key_values
        delattr(cache, KEY_POSITIONS)
        with pytest.raises(
            ValueError, match=r"position_ids 50\.\.57 for 8 new tokens do not continue the KV cache of 6 tokens"
        ):
            model(input_ids=tokens[:, 6:], position_ids=positions[:, 6:], past_key_values=cache)
        step = model(input_ids=tokens[:, 6:], past_key_values=cache)
    torch.testing.assert_close(step.logits, logits(model, tokens)[:, 6:], atol=1e-5, rtol=0)


# -- item 7: hand-edited posswap blocks ----------------------------------------------------------------------------


def _set(**values):
    return lambda block: block.update(values)


def _drop(key):
    return lambda block: block.pop(key)


# id -> (arch, method config, edit to the saved block, the message's key part; None: only posswap.from_pretrained
# refuses it, as trust_remote_code loads an interpolated folder as the plain model it is)
EDITS = {
    "tupe-without-cls_reset": (
        "gpt2",
        posswap.TupeConfig(max_length=NEW),
        _drop("cls_reset"),
        "block (tupe) has no 'cls_reset'",
    ),
    "sinusoidal-without-scale": (
        "gpt2",
        posswap.SinusoidalConfig(max_length=NEW),
        _drop("scale"),
        "block (sinusoidal) has no 'scale'",
    ),
    "rope-max_length-string": (
        "gpt2",
        posswap.RopeConfig(max_length=NEW),
        _set(max_length=str(NEW)),
        f"block (rope) key 'max_length' must be an integer >= 1; got '{NEW}'",
    ),
    "t5-num_buckets-fraction": (
        "gpt2",
        posswap.T5BiasConfig(max_length=NEW),
        _set(num_buckets=3.5),
        "block (t5-bias) key 'num_buckets' must be an integer >= 4 and <= 65536; got 3.5",
    ),
    "rope-original_length-zero": (
        "bert",
        posswap.RopeConfig(max_length=NEW),
        _set(original_length=0),
        "block (rope) key 'original_length' must be an integer >= 1; got 0",
    ),
    "alibi-unknown-key": (
        "gpt2",
        posswap.AlibiConfig(max_length=NEW),
        _set(slopes=[0.5]),
        "block (alibi) has unknown key(s) 'slopes'",
    ),
    "t5-num_buckets-not-the-weights": (
        "gpt2",
        posswap.T5BiasConfig(max_length=NEW),
        _set(num_buckets=16),
        "block (t5-bias) does not match the weights: transformer.posswap_bias_providers.0."
        "relative_attention_bias.weight is [32, 4] in the checkpoint, but the block's 'num_buckets' (16) builds [16, 4]",
    ),
    "tupe-max_length-not-n_positions": (
        "gpt2",
        posswap.TupeConfig(max_length=NEW),
        _set(max_length=96),
        f"block (tupe) key 'max_length' is 96 but config.json's n_positions is {NEW}",
    ),
    "rope-max_length-not-n_positions": (
        "gpt2",
        posswap.RopeConfig(max_length=NEW, rope_type="linear"),
        _set(max_length=2 * NEW),
        f"block (rope) key 'max_length' is {2 * NEW} but config.json's n_positions is {NEW}",
    ),
    "roberta-alibi-max_length": (
        "roberta",
        posswap.AlibiConfig(max_length=NEW),
        _set(max_length=NEW + 2),
        f"key 'max_length' is {NEW + 2} but config.json's max_position_embeddings is {NEW + 2} "
        "(it must be max_length + 2 padding rows)",
    ),
    "interpolate-max_length-not-n_positions": (
        "gpt2",
        posswap.InterpolateConfig(max_length=NEW),
        _set(max_length=96),
        f"block (interpolate) key 'max_length' is 96 but config.json's n_positions is {NEW}",
    ),
}
REMOTE_ONLY_POSSWAP = {"interpolate-max_length-not-n_positions"}

REMOTE_LOADER = WITHOUT_POSSWAP + textwrap.dedent("""
    import json, sys
    import transformers
    transformers.logging.set_verbosity_error()
    results = {}
    for name, folder in json.loads(sys.argv[1]).items():
        config = json.load(open(folder + "/config.json"))
        auto = transformers.AutoModelForCausalLM if "gpt2" in config["model_type"] else transformers.AutoModelForMaskedLM
        try:
            auto.from_pretrained(folder, trust_remote_code=True)
            results[name] = "loaded"
        except Exception as error:
            results[name] = f"{type(error).__name__}: {error}"
    print(json.dumps(results))
""")


@pytest.fixture(scope="module")
def edited(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("edited")
    folders = {}
    for name, (arch, config, edit, _) in EDITS.items():
        model = posswap.patch(tiny(arch), config)
        model.save_pretrained(root / name)
        data = json.loads((root / name / "config.json").read_text())
        edit(data["posswap"])
        (root / name / "config.json").write_text(json.dumps(data))
        folders[name] = root / name
    return folders


@pytest.mark.parametrize("name", EDITS)
def test_a_hand_edited_block_is_named_by_posswap(edited, name):
    with pytest.raises(ValueError) as caught:
        posswap.from_pretrained(str(edited[name]))
    message = str(caught.value)
    assert message.startswith(f"{edited[name]}/config.json: the 'posswap' block") and "\n" not in message, message
    assert EDITS[name][3] in message, message


def test_a_hand_edited_block_is_named_without_posswap(edited, tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_MODULES_CACHE": str(tmp_path / "modules")}
    jobs = {name: str(folder) for name, folder in edited.items()}
    done = subprocess.run(
        [sys.executable, "-c", REMOTE_LOADER, json.dumps(jobs)], capture_output=True, text=True, env=env, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads(done.stdout.strip().splitlines()[-1])
    for name, result in results.items():
        if name in REMOTE_ONLY_POSSWAP:
            assert result == "loaded"  # a plain GPT-2 folder: transformers reads its table, posswap's block is not used
            continue
        assert result.startswith(f"ValueError: {edited[name]}/config.json: the 'posswap' block"), (name, result)
        assert EDITS[name][3] in result, (name, result)


def test_a_hand_edited_block_is_one_line_in_the_cli(edited, tmp_path, capsys):
    code = main(
        [
            "patch",
            str(edited["t5-num_buckets-fraction"]),
            "--method",
            "t5-bias",
            "--max-length",
            "256",
            "--out",
            str(tmp_path / "o"),
        ]
    )
    one_line_error(code, capsys.readouterr().err, EDITS["t5-num_buckets-fraction"][3])
    assert not (tmp_path / "o").exists()


# -- item 8: position ids of the wrong length ----------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
@pytest.mark.parametrize("method", FACTORIES)
def test_position_ids_of_the_wrong_length_are_refused(method, arch):
    """3 or 5 ids for 4 tokens ran without an error under ALiBi, T5 bias, TUPE and NoPE (TUPE's output changed)."""
    model = patched(method, arch)
    tokens = ids(4, batch=2)
    for count in (3, 5):
        with pytest.raises(
            ValueError, match=rf"position_ids has {count} positions per sequence but the input has 4 tokens"
        ):
            logits(model, tokens, position_ids=torch.arange(count)[None])
    with pytest.raises(ValueError, match="position_ids has 3 rows but the input has a batch of 2"):
        logits(model, tokens, position_ids=torch.arange(4).expand(3, -1))
    torch.testing.assert_close(logits(model, tokens, position_ids=torch.arange(4)[None]), logits(model, tokens))


# -- item 9: a tokenizer whose ids exceed the model's vocabulary ----------------------------------------------------


def test_a_tokenizer_larger_than_the_vocabulary_is_refused_before_training(bases, tmp_path, capsys):
    """A tiny GPT-2 of 211 rows with the GPT-2 tokenizer trained into `IndexError: index out of range in self`."""
    from posswap.data import GPT2_TOKENIZER_DIR

    small = tmp_path / "small"
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=211, n_positions=32)
    ).save_pretrained(small)
    run_dir = tmp_path / "run"
    raw = {
        "model": str(small),
        "tokenizer": str(GPT2_TOKENIZER_DIR),
        "posswap": {"method": "rope", "max_length": 64},
        "data": {"train": str(bases / "text.txt")},
        "train": {"output_dir": str(run_dir), "max_steps": 2, "batch_size": 2},
    }
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(raw))
    capsys.readouterr()
    code = main(["train", str(recipe)])
    one_line_error(
        code, capsys.readouterr().err, "the tokenizer has 50257 tokens but the model's vocabulary has 211 rows"
    )
    assert not (run_dir / "model").exists() and not (run_dir / "log.jsonl").exists()


# -- item 10: YAML alias bombs ---------------------------------------------------------------------------------------

BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{prev}'] * 9) if prev else ', '.join(['lol'] * 9)}]\n"
    for prev, name in zip([None, "a", "b", "c", "d", "e", "f", "g"], "abcdefgh")
)  # h expands to 9**8 = 43 million strings; the YAML text is 400 bytes


@pytest.mark.parametrize("key", ["train.max_steps", "train.curriculum", "push_to_hub", "train.seed"])
def test_an_alias_bomb_is_refused_in_well_under_a_second(bases, tmp_path, capsys, key):
    import time

    raw = {
        "model": str(bases / "gpt2"),
        "posswap": {"method": "rope", "max_length": 64},
        "data": {"train": str(bases / "text.txt")},
        "train": {"output_dir": str(tmp_path / "run"), "max_steps": 2},
    }
    block, _, leaf = key.rpartition(".")
    (raw[block] if block else raw)[leaf] = "BOMB"
    recipe = tmp_path / "recipe.yaml"  # JSON is YAML; the bomb is one flow mapping where the value goes
    recipe.write_text(json.dumps(raw).replace('"BOMB"', "{" + ", ".join(BOMB.splitlines()) + ", x: *h}"))
    capsys.readouterr()
    start = time.perf_counter()
    code = main(["train", str(recipe)])
    elapsed = time.perf_counter() - start
    line = one_line_error(code, capsys.readouterr().err, "aliases")
    assert elapsed < 0.5 and len(line) < 300, (elapsed, line[:300])
    assert not (tmp_path / "run").exists()


def test_an_alias_bomb_in_a_set_value_is_refused(bases, tmp_path, capsys):
    import time

    from test_training import make_raw

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(make_raw(bases, tmp_path / "run", max_steps=2)))
    value = "{" + ", ".join(BOMB.splitlines()) + ", x: *h}"  # the bomb as one flow mapping
    start = time.perf_counter()
    code = main(["train", str(recipe), "--set", f"train.max_steps={value}"])
    elapsed = time.perf_counter() - start
    line = one_line_error(code, capsys.readouterr().err, "aliases")
    assert elapsed < 0.5 and len(line) < 300, (elapsed, line[:300])


def test_a_long_value_is_shown_cut_to_a_line(bases, tmp_path, capsys):
    """No alias, just a long value: the message shows its start, not all of it."""
    from test_training import make_raw

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(make_raw(bases, tmp_path / "run", max_steps=list(range(100_000)))))
    code = main(["train", str(recipe)])
    line = one_line_error(code, capsys.readouterr().err, "train.max_steps must be a positive integer, got [0, 1, 2")
    assert len(line) < 300, line[:400]


# -- item 11 and the rough edges of push -----------------------------------------------------------------------------


def test_a_push_to_a_hub_that_never_answers_times_out_in_one_line(hub, tmp_path, capsys, monkeypatch):
    """The server accepts the commit and never answers: the push used to hang forever (the client has no timeout)."""
    import time

    import posswap.hub

    folder = tmp_path / "out"
    posswap.patch(tiny(), posswap.RopeConfig(max_length=NEW)).save_pretrained(folder)
    monkeypatch.setattr(posswap.hub, "HUB_TIMEOUT", 0.5, raising=False)
    hub.stall_commits = True
    start = time.perf_counter()
    code = main(["push", str(folder), "me/stalled"])
    elapsed = time.perf_counter() - start
    line = one_line_error(code, capsys.readouterr().err, f"the Hub at {hub.url} did not answer within 0.5 s")
    assert "POSSWAP_HUB_TIMEOUT" in line and f"posswap push {folder} me/stalled" in line, line
    assert elapsed < 30, elapsed
    hub.release.set()
    assert not (folder / "plots").exists()


def test_push_skips_links_that_leave_the_folder(hub, tmp_path, capsys):
    """A link in the folder to a file outside it used to send that file's contents to the Hub."""
    folder = tmp_path / "out"
    posswap.patch(tiny(), posswap.RopeConfig(max_length=NEW)).save_pretrained(folder)
    secret = tmp_path / "secret.txt"
    secret.write_text("xyzzy-private-1")
    (folder / "notes.txt").symlink_to(secret)
    (folder / "inside.txt").write_text("kept")
    (folder / "alias.txt").symlink_to(folder / "inside.txt")  # a link within the folder is fine
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "key").write_text("xyzzy-private-2")
    (folder / "linked-dir").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert main(["push", str(folder), "me/links"]) == 0
    err = capsys.readouterr().err
    files = hub.files("me/links")
    assert not any(b"xyzzy-private" in data for data in files.values()), sorted(files)
    assert "notes.txt" not in files and not any(name.startswith("linked-dir") for name in files)
    assert files["alias.txt"] == b"kept" and "config.json" in files
    assert "skipped 2 link(s) that point outside" in err and "notes.txt" in err and "linked-dir" in err, err
    assert (folder / "notes.txt").is_symlink()  # the user's folder is left as it was


def test_a_refused_push_leaves_no_plots_in_the_folder(hub, tmp_path, capsys):
    folder = tmp_path / "out"
    posswap.patch(tiny(), posswap.RopeConfig(max_length=NEW)).save_pretrained(folder)
    plot = tmp_path / "ppl.png"
    plot.write_bytes(b"\x89PNG not really")
    before = sorted(p.name for p in folder.iterdir())
    hub.token = "other"  # the Hub refuses this client's token
    code = main(["push", str(folder), "me/refused", "--plots", str(plot)])
    assert code == 2 and "refused" in capsys.readouterr().err
    assert sorted(p.name for p in folder.iterdir()) == before  # no plots/, no README.md


def test_a_push_leaves_the_folder_as_it_was_and_uploads_card_and_plots(hub, tmp_path):
    folder = tmp_path / "out"
    posswap.patch(tiny(), posswap.RopeConfig(max_length=NEW)).save_pretrained(folder)
    plot = tmp_path / "ppl.png"
    plot.write_bytes(b"\x89PNG not really")
    before = sorted(p.name for p in folder.iterdir())
    assert main(["push", str(folder), "me/kept", "--plots", str(plot)]) == 0
    assert sorted(p.name for p in folder.iterdir()) == before
    files = hub.files("me/kept")
    assert files["plots/ppl.png"] == plot.read_bytes() and "![ppl](plots/ppl.png)" in files["README.md"].decode()


# -- rough edges: the final save target, a push at the end of training ----------------------------------------------


def _immutable(path: Path, on: bool) -> bool:
    """chattr +i: a folder that even root cannot change (the tests run as root, where permission bits do nothing)."""
    done = subprocess.run(["chattr", "+i" if on else "-i", str(path)], capture_output=True)
    return done.returncode == 0


def test_an_unwritable_final_model_folder_is_found_before_training(bases, tmp_path, capsys):
    """The run used to train to the end and then fail at the final save, losing the steps since the last checkpoint."""
    from test_training import make_raw

    run_dir = tmp_path / "run"
    (run_dir / "model").mkdir(parents=True)
    if not _immutable(run_dir / "model", True):
        pytest.skip("chattr +i is not available here")
    try:
        recipe = tmp_path / "recipe.yaml"
        recipe.write_text(json.dumps(make_raw(bases, run_dir, max_steps=2)))
        capsys.readouterr()
        code = main(["train", str(recipe)])
        one_line_error(
            code, capsys.readouterr().err, f"train.output_dir: model folder {run_dir / 'model'}: cannot write there"
        )
        assert sorted(p.name for p in run_dir.iterdir()) == [
            "model"
        ]  # refused before the first step: no log, no checkpoint
    finally:
        _immutable(run_dir / "model", False)


def test_a_push_failing_at_the_end_of_training_says_where_the_model_is(bases, hub, tmp_path, capsys):
    from test_training import make_raw

    run_dir = tmp_path / "run"
    raw = make_raw(bases, run_dir, max_steps=2)
    raw["push_to_hub"] = "me/trained"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(raw))
    hub.token = "other"  # the Hub refuses the upload
    capsys.readouterr()
    code = main(["train", str(recipe)])
    err = capsys.readouterr().err
    line = err.strip().splitlines()[-1]  # after the training's progress bars
    assert code == 2 and "Traceback" not in err and line.startswith("posswap train: error: "), err
    assert (
        f"the trained model is saved in {run_dir / 'model'}, but the push to me/trained failed: Client error '401 Unauthorized'"
        in line
    ), line
    assert f"posswap push {run_dir / 'model'} me/trained" in line
    assert posswap.from_pretrained(str(run_dir / "model")).config.posswap["method"] == "rope"


# -- rough edges: exit 2 with one line where a user can fix the cause ------------------------------------------------


@pytest.mark.parametrize(
    "name,content,expected",
    [
        (
            "bad.txt",
            b"It is a truth universally acknowledged\n\xff\xfe that a single man\n",
            "is not UTF-8 text: byte 0xff on line 2",
        ),
        ("bad.jsonl", b'{"text": "a"}\n{"text": "b"\n{"text": "c"}\n', "line 2 is not valid JSON"),
        ("list.jsonl", b'{"text": "a"}\n[1, 2]\n', "line 2 is not a JSON object"),
        ("binary.txt", b"PK\x03\x04\x00\x00\x00binary", "looks binary (a NUL byte on line 1)"),
    ],
)
def test_unreadable_training_data_is_one_line_naming_the_file(bases, tmp_path, capsys, name, content, expected):
    from test_training import make_raw

    data = tmp_path / name
    data.write_bytes(content)
    raw = make_raw(bases, tmp_path / "run", max_steps=2)
    raw["data"]["train"] = str(data)
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(json.dumps(raw))
    capsys.readouterr()
    code = main(["train", str(recipe)])
    one_line_error(code, capsys.readouterr().err, f"data.train: {data} {expected}")
    assert not (tmp_path / "run").exists()


def test_a_full_disk_while_patching_is_one_line(base_folder, tmp_path, capsys, monkeypatch):
    import safetensors
    import transformers.modeling_utils

    def full(*args, **kwargs):  # what safetensors raises when the disk fills up under it
        raise safetensors.SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")

    monkeypatch.setattr(transformers.modeling_utils, "safe_save_file", full)
    code = main(
        ["patch", str(base_folder), "--method", "rope", "--max-length", str(NEW), "--out", str(tmp_path / "out")]
    )
    one_line_error(
        code, capsys.readouterr().err, "the disk is full (No space left on device); free some space and run again"
    )
    assert not (tmp_path / "out").exists() and leftovers(tmp_path) == []


def test_an_unreachable_hub_is_one_line(hub, tmp_path, capsys, monkeypatch):
    import socket

    import huggingface_hub

    folder = tmp_path / "out"
    posswap.patch(tiny(), posswap.RopeConfig(max_length=NEW)).save_pretrained(folder)
    with socket.socket() as closed:  # a port nobody listens on: connection refused at once
        closed.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{closed.getsockname()[1]}"
    monkeypatch.setattr(huggingface_hub.constants, "ENDPOINT", url)
    code = main(["push", str(folder), "me/unreachable"])
    line = one_line_error(code, capsys.readouterr().err, f"could not reach the Hub at {url} (ConnectError")
    assert f"run `posswap push {folder} me/unreachable` again" in line


# -- rough edges: a tokenizer config that maps to custom code ------------------------------------------------------


def _custom_code_tokenizer(folder: Path, tokenizer_class: str) -> None:
    from posswap.data import GPT2_TOKENIZER_DIR

    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(
        transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=len(tokenizer), n_positions=32)
    ).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.update(
        tokenizer_class=tokenizer_class, auto_map={"AutoTokenizer": ["tokenization_evil.EvilTokenizer", None]}
    )
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    (folder / "tokenization_evil.py").write_text("raise SystemExit('custom code ran')\n")


@pytest.mark.parametrize("tokenizer_class", ["GPT2Tokenizer", "EvilTokenizer"])
def test_a_tokenizer_mapped_to_custom_code_is_never_prompted_for(tmp_path, capsys, monkeypatch, tokenizer_class):
    """`posswap patch` stopped to ask "Do you wish to run the custom code? [y/N]" and kept a dangling auto_map. Now it
    loads the tokenizer with transformers' own class, never asking, and the output's tokenizer config has no auto_map."""
    import builtins

    source = tmp_path / "src"
    _custom_code_tokenizer(source, tokenizer_class)
    monkeypatch.setattr(transformers.dynamic_module_utils, "TIME_OUT_REMOTE_CODE", 15)
    prompts = []
    monkeypatch.setattr(builtins, "input", lambda *args: prompts.append(args) or "n")
    out = tmp_path / "out"
    assert main(["patch", str(source), "--method", "rope", "--max-length", "64", "--out", str(out)]) == 0, (
        capsys.readouterr().err
    )
    assert prompts == []
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert "auto_map" not in saved and not (out / "tokenization_evil.py").exists()
    assert (
        transformers.AutoTokenizer.from_pretrained(out)("a b").input_ids
        == transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=False)("a b").input_ids
    )


# -- rough edges: the meta device ------------------------------------------------------------------------------------


@pytest.mark.parametrize("arch", ["gpt2", "bert"])
@pytest.mark.parametrize("method", FACTORIES)
def test_forward_on_the_meta_device_runs_as_stock(method, arch):
    """Shapes without data (memory planning, torch.device("meta") tracing): RoPE raised "unsupported scalarType" (autocast
    has no meta device) and T5 bias / TUPE called .item() on meta tensors; the stock model runs."""
    stock, model = tiny(arch).to("meta"), patched(method, arch).to("meta")
    tokens = ids(8, batch=2).to("meta")
    with torch.no_grad():
        expected, out = stock(input_ids=tokens).logits, model(input_ids=tokens).logits
    assert out.device.type == "meta" and out.shape == expected.shape
