"""Two processes on the CPU through the shipped configs (recipes/accelerate/cpu-ddp.yaml and cpu-fsdp.yaml), each
against one process that takes the same global batch: 2 processes x 2 windows against 1 x 4. The tiny GPT-2 has no
dropout, so a step's loss depends only on the weights and the windows: equal losses step after step mean the data
was sharded into the same global batch and the gradients were averaged over it."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from conftest import TEXT

import posswap
from posswap.data import GPT2_TOKENIZER_DIR
from posswap.training import recipe_from_dict, train

CONFIGS = Path(__file__).parents[1] / "recipes" / "accelerate"
STEPS = 3
PROCESSES = 2


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> Path:
    """A tiny GPT-2 without dropout, the GPT-2 tokenizer, and 40k characters of text (about 160 windows of 64)."""
    root = tmp_path_factory.mktemp("distributed")
    (root / "text.txt").write_text(TEXT[:40_000])
    tokenizer = transformers.AutoTokenizer.from_pretrained(GPT2_TOKENIZER_DIR)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=32, n_head=4, vocab_size=len(tokenizer), n_positions=32, resid_pdrop=0.0
    )
    config.embd_pdrop = config.attn_pdrop = 0.0
    torch.manual_seed(0)
    transformers.GPT2LMHeadModel(config).save_pretrained(root / "gpt2")
    tokenizer.save_pretrained(root / "gpt2")
    return root


def recipe(base: Path, out: Path, batch_size: int, save_every: int = STEPS) -> dict:
    # save_every reaches max_steps by default: FSDP writes no resumable checkpoint.
    return {
        "model": str(base / "gpt2"),
        "posswap": {"method": "rope", "max_length": 64},
        "data": {"train": str(base / "text.txt")},
        "train": {
            "output_dir": str(out),
            "max_steps": STEPS,
            "batch_size": batch_size,
            "lr": 3e-3,
            "warmup_steps": 0,
            "save_every": save_every,
            "log_every": 1,
        },
    }


def losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


def logits(model_dir: Path) -> torch.Tensor:
    model = posswap.from_pretrained(str(model_dir)).eval()
    ids = torch.arange(1, 61).remainder(model.config.vocab_size - 1)[None]
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.fixture(scope="module")
def one_process(base, tmp_path_factory) -> Path:
    """The reference: one process (in this one) taking all four windows of each step."""
    out = tmp_path_factory.mktemp("one") / "run"
    raw = recipe(base, out, batch_size=PROCESSES * 2)
    train(recipe_from_dict(raw), raw)
    return out


def free_port() -> int:
    """A port no one listens on now: two test runs at once must not meet on accelerate's default 29500."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launch(
    config: str, base: Path, tmp_path: Path, save_every: int = STEPS
) -> tuple[Path, subprocess.CompletedProcess]:
    """``posswap train`` under ``accelerate launch --config_file config``: two processes of two windows each."""
    out = tmp_path / "run"
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe(base, out, batch_size=2, save_every=save_every)))
    command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(CONFIGS / config)]
    command += ["--main_process_port", str(free_port()), "-m", "posswap", "train", str(path)]
    # No GPU in sight, so that the configs run on the CPU on any machine.
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return out, done


def test_cpu_ddp_loss_equals_one_process_on_the_same_global_batch(base, one_process, tmp_path):
    out, _ = launch("cpu-ddp.yaml", base, tmp_path, save_every=STEPS - 1)
    # One line a step: the main process alone writes the log (two writers would double it).
    assert len(losses(out)) == STEPS
    assert losses(out) == pytest.approx(losses(one_process), rel=1e-5)
    assert torch.allclose(logits(out / "model"), logits(one_process / "model"), atol=1e-4)
    # Its checkpoint resumes both processes: the world size, and each process's random state.
    checkpoint = out / f"checkpoint-{STEPS - 1}"
    assert json.loads((checkpoint / "state.json").read_text())["world_size"] == PROCESSES
    assert all((checkpoint / f"rng-{rank}.safetensors").is_file() for rank in range(PROCESSES))


def test_the_gpu_ddp_config_is_the_cpu_one_but_for_the_device():
    """recipes/accelerate/ddp.yaml runs only where there are GPUs; cpu-ddp.yaml, launched above, is it on the CPU."""
    gpu, cpu = (yaml.safe_load((CONFIGS / name).read_text()) for name in ("ddp.yaml", "cpu-ddp.yaml"))
    assert gpu.pop("use_cpu") is False and cpu.pop("use_cpu") is True and gpu.pop("gpu_ids") == "all"
    assert gpu == cpu


def test_cpu_fsdp_shards_and_writes_the_model_one_process_trains(base, one_process, tmp_path):
    out, done = launch("cpu-fsdp.yaml", base, tmp_path)
    # The model was sharded: the main process held about half of it (the rest of 2 processes, not all of it).
    held, total = map(int, done.stdout.split("the main process holds ")[1].split(" parameter")[0].split(" of "))
    assert total / PROCESSES <= held < 0.6 * total
    assert len(losses(out)) == STEPS
    assert losses(out) == pytest.approx(losses(one_process), rel=1e-5)
    # The saved model is whole, loads with posswap, and computes what the one-process model does.
    assert posswap.from_pretrained(str(out / "model")).config.posswap["method"] == "rope"
    assert torch.allclose(logits(out / "model"), logits(one_process / "model"), atol=1e-4)
