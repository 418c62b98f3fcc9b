"""The shipped FSDP config (recipes/accelerate/fsdp.yaml) through `accelerate launch`. accelerate turns an FSDP
config into FSDP only on accelerators (GPU, XPU, NPU...); on the CPU posswap shards the model itself with FSDP2
(tests/test_distributed_cpu.py runs recipes/accelerate/cpu-fsdp.yaml), and refuses what it cannot shard there."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import yaml
from accelerate.utils import DistributedType
from test_training import make_raw

import posswap
from posswap.cli import main
from posswap.training import loop
from posswap.training.cpu_fsdp import shards_on_cpu

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


def test_fsdp_config_on_one_cpu_process_is_refused(bases, tmp_path, monkeypatch, capsys):
    """One process has nothing to shard with: refused in one line before the model is loaded, nothing written."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "2")
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(make_raw(bases, tmp_path / "run", "gpt2", "rope", max_steps=4, save_every=4)))
    assert main(["train", str(path)]) == 2
    assert "asks for FSDP, but accelerate runs this as NO with 1 process(es)" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()


def test_fsdp1_on_cpu_is_refused(monkeypatch):
    """FSDP on the CPU is posswap's fully_shard (FSDP2): a config asking for FSDP1 there is told so."""
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "true")
    monkeypatch.setenv("FSDP_VERSION", "1")
    cpu_processes = SimpleNamespace(distributed_type=DistributedType.MULTI_CPU, num_processes=2)
    with pytest.raises(ValueError, match="runs FSDP2 only .* asks for fsdp_version 1"):
        shards_on_cpu(cpu_processes)
    monkeypatch.setenv("FSDP_VERSION", "2")
    assert shards_on_cpu(cpu_processes)
    monkeypatch.setenv("ACCELERATE_USE_FSDP", "false")
    assert not shards_on_cpu(cpu_processes)


def test_resuming_under_fsdp_is_refused(bases, tmp_path, monkeypatch, capsys):
    """A checkpoint holds whole tensors, not FSDP's shards: resuming one under FSDP is refused before the model is
    loaded (the sharding decision stands in for a two-process FSDP launch), and the run folder is left as it was."""
    raw = make_raw(bases, tmp_path / "run", "gpt2", "rope", max_steps=2, save_every=1)
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["train", str(path)]) == 0
    before = sorted(p.name for p in (tmp_path / "run").iterdir())
    monkeypatch.setattr(loop, "shards_on_cpu", lambda accelerator: True)
    path.write_text(yaml.safe_dump({**raw, "train": {**raw["train"], "max_steps": 4, "save_every": 4}}))
    assert main(["train", str(path), "--resume", "--force"]) == 2
    assert "Resuming is not supported under FSDP yet" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "run").iterdir()) == before


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
    assert listed == {name for arch in ARCHITECTURES.values() for name in arch.layer_classes}
    for arch in ARCHITECTURES.values():
        module = transformers.models.auto.configuration_auto.model_type_to_module_name(arch.model_type)
        assert hasattr(getattr(transformers.models, module), f"modeling_{module}")
        for name in arch.layer_classes:
            assert hasattr(getattr(getattr(transformers.models, module), f"modeling_{module}"), name)
