"""The shipped FSDP config (recipes/accelerate/fsdp.yaml) through `accelerate launch`. accelerate turns an FSDP
config into FSDP only on accelerators (GPU, XPU, NPU...): on CPU it would run as MULTI_CPU data parallel over
gloo, so there posswap refuses it rather than pretend, and the real run needs GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_training import make_raw

import posswap

CONFIG = Path(__file__).parents[1] / "recipes" / "accelerate" / "fsdp.yaml"


def launch(bases: Path, tmp_path: Path, processes: int, **train) -> subprocess.CompletedProcess:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(make_raw(bases, tmp_path / "run", "gpt2", "rope", **train)))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIG),
        "--num_processes",
        str(processes),
        "-m",
        "posswap",
        "train",
        str(recipe),
    ]
    return subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU the FSDP config runs: see the test below")
def test_fsdp_config_on_cpu_is_refused_not_run_as_ddp(bases, tmp_path):
    done = launch(bases, tmp_path, 2, max_steps=4, save_every=4)
    assert done.returncode != 0
    assert "asks for FSDP, which accelerate runs only on GPUs" in done.stderr and "MULTI_CPU" in done.stderr
    assert not (tmp_path / "run" / "model").exists()


@pytest.mark.skipif(
    not torch.cuda.is_available(), reason="accelerate runs FSDP only on accelerators; this machine has no GPU"
)
def test_fsdp_config_trains_a_few_steps(bases, tmp_path):
    # Resumable checkpoints are refused under FSDP (they hold whole tensors), so save_every reaches max_steps.
    done = launch(bases, tmp_path, min(2, torch.cuda.device_count()), max_steps=4, save_every=4)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len((tmp_path / "run" / "log.jsonl").read_text().splitlines()) == 4
    assert posswap.from_pretrained(str(tmp_path / "run" / "model")).config.posswap["method"] == "rope"


def test_fsdp_config_wraps_every_architectures_block():
    """The layer class FSDP wraps is a fact of architectures.py; the shipped config must list each one."""
    import transformers

    from posswap.portable.posswap_architectures import ARCHITECTURES

    config = yaml.safe_load((Path(__file__).parents[1] / "recipes/accelerate/fsdp.yaml").read_text())
    listed = set(config["fsdp_config"]["fsdp_transformer_layer_cls_to_wrap"].split(","))
    assert listed == {arch.layer_class for arch in ARCHITECTURES.values()}
    for arch in ARCHITECTURES.values():
        module = transformers.models.auto.configuration_auto.model_type_to_module_name(arch.model_type)
        assert hasattr(getattr(transformers.models, module), f"modeling_{module}")
        assert hasattr(getattr(getattr(transformers.models, module), f"modeling_{module}"), arch.layer_class)
