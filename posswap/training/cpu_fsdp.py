"""FSDP2 on the CPU. accelerate (1.15) turns an FSDP config into FSDP only on accelerators: on the CPU it runs the
processes as plain data parallel (MULTI_CPU over gloo). There posswap shards the model itself, as accelerate does on
GPUs: ``fully_shard`` on every transformer block and on the whole model, over an explicit CPU device mesh of all the
processes (recipes/accelerate/cpu-fsdp.yaml). The model is then not handed to ``accelerator.prepare``, which would
wrap it in DDP as well; the optimizer and the data loader are."""

from __future__ import annotations

import os

import torch
from accelerate import Accelerator
from accelerate.utils import DistributedType
from torch import nn

from ..portable.posswap_architectures import find_sites


def fsdp_requested() -> bool:
    """Whether the accelerate config that launched this process asks for FSDP (``accelerate launch`` says so in
    the environment)."""
    return os.environ.get("ACCELERATE_USE_FSDP", "").lower() == "true"


def shards_on_cpu(accelerator: Accelerator) -> bool:
    """True when the config asks for FSDP and accelerate runs data parallel on the CPU instead: posswap shards.
    Any other way accelerate could leave an FSDP request unmet is refused here, before anything is loaded."""
    if not fsdp_requested() or accelerator.distributed_type == DistributedType.FSDP:
        return False
    if accelerator.distributed_type != DistributedType.MULTI_CPU:
        raise ValueError(
            f"The accelerate config asks for FSDP, but accelerate runs this as {accelerator.distributed_type.value} "
            f"with {accelerator.num_processes} process(es): FSDP needs at least 2 (num_processes in the config)."
        )
    version = os.environ.get("FSDP_VERSION", "1")
    if version != "2":
        raise ValueError(
            f"FSDP on the CPU runs FSDP2 only (fully_shard), the accelerate config asks for fsdp_version {version}: "
            "set fsdp_version: 2 (recipes/accelerate/cpu-fsdp.yaml)."
        )
    return True


def shard(model: nn.Module, accelerator: Accelerator) -> nn.Module:
    """``model`` sharded in place over a CPU mesh of every process: each block the config names
    (``fsdp_transformer_layer_cls_to_wrap``; by default this architecture's) is one FSDP unit, the rest the root's."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    listed = os.environ.get("FSDP_TRANSFORMER_CLS_TO_WRAP")
    names = set(listed.split(",")) if listed else find_sites(model).arch.layer_classes
    blocks = [module for module in model.modules() if type(module).__name__ in names]
    if not blocks:
        raise ValueError(
            f"None of the layer classes the FSDP config wraps ({', '.join(sorted(names))}) is in "
            f"{type(model).__name__}: add its block class to fsdp_transformer_layer_cls_to_wrap."
        )
    mesh = init_device_mesh("cpu", (accelerator.num_processes,))
    reshard = os.environ.get("FSDP_RESHARD_AFTER_FORWARD", "true").lower() == "true"
    for block in blocks:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    held, total = _held_elements(model)
    accelerator.print(
        f"FSDP2 on the CPU: {len(blocks)} blocks and the root sharded over {accelerator.num_processes} processes; "
        f"the main process holds {held} of {total} parameter elements."
    )
    return model


def _held_elements(model: nn.Module) -> tuple[int, int]:
    """(elements this process holds, elements of the whole model), read from the sharded parameters."""
    from torch.distributed.tensor import DTensor

    held = total = 0
    for parameter in model.parameters():
        local = parameter.to_local() if isinstance(parameter, DTensor) else parameter
        held, total = held + local.numel(), total + parameter.numel()
    return held, total


def full_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The whole state dict, gathered onto the main process's CPU (empty on the others). A collective: every
    process calls it."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
