"""RoPE at run time: cos/sin from each attention module's ``position_ids``, rotation on its q/k projections.

Keys are rotated as the projection produces them, before the attention module writes them to the KV cache
(as Llama's attention does), so cached keys keep the rotation of their own positions and the attention kernel
(SDPA, flex, eager) runs unchanged. Hooks are callable objects, not closures, and per-forward cos/sin live on
the modules: ``copy.deepcopy`` and DataParallel replicas each rotate with their own state.

Frequencies are computed on first use, per device, in fp32: never a buffer, so building the model on the meta
device (transformers' loading) and ``model.to(torch.bfloat16)`` leave them exact.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import torch
from torch import nn

from .posswap_functional import apply_rotary, rope_frequencies, rotary_cos_sin
from .posswap_hooks import remove_hooks


def resolve_rotary_dim(rotary_dim: float | int | None, head_dim: int) -> int:
    if rotary_dim is None:
        return head_dim
    dims = int(round(rotary_dim * head_dim)) if isinstance(rotary_dim, float) else rotary_dim
    if dims % 2 or not 0 < dims <= head_dim:
        raise ValueError(f"rotary_dim={rotary_dim!r} gives {dims} of {head_dim} head dims; it must be even and at most {head_dim}.")
    return dims


class Rotary(nn.Module):
    """Frequencies of one model (shared by its layers) from the saved posswap block; no parameters, no buffers."""

    def __init__(self, block: dict, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = resolve_rotary_dim(block.get("rotary_dim"), head_dim)
        self.theta = float(block.get("theta", 10000.0))
        self.scaling = block.get("scaling")
        self.original_length = block["original_length"]
        factor = block.get("factor")
        self.factor = max(factor if factor is not None else block["max_length"] / self.original_length, 1.0)
        self._inv_freq: dict[torch.device, tuple[torch.Tensor, float]] = {}
        self._last: tuple | None = None  # (position_ids, (cos, sin)) of the current forward

    def frequencies(self, device: torch.device, seq_len: int | None = None) -> tuple[torch.Tensor, float]:
        """fp32 inverse frequencies and the cos/sin scale; ``seq_len`` only matters for dynamic scaling."""
        if seq_len is not None:
            inv_freq, scale = self._compute(seq_len)
            return inv_freq.to(device), scale
        if device not in self._inv_freq:
            inv_freq, scale = self._compute(None)
            self._inv_freq[device] = (inv_freq.to(device), scale)
        return self._inv_freq[device]

    def _compute(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        return rope_frequencies(
            self.head_dim, self.rotary_dim, self.theta, self.scaling, self.factor, self.original_length, seq_len
        )

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer gets the same position_ids tensor in one forward: computed once, then reused (by
        identity: the tensor is held here, so its id cannot be reused while the entry lives)."""
        if self._last is None or self._last[0] is not position_ids:
            self._last = (position_ids, self._cos_sin(position_ids))
        return self._last[1]

    def _cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        seq_len = None
        if self.scaling == "dynamic":  # frequencies follow the longest position seen (NTK-aware)
            longest = int(position_ids.max()) + 1
            seq_len = longest if longest > self.original_length else None
        inv_freq, scale = self.frequencies(position_ids.device, seq_len)
        return rotary_cos_sin(inv_freq, position_ids, scale)

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, theta={self.theta}, scaling={self.scaling}, factor={self.factor}"


class RotateProjection:
    """Forward hook on a q/k projection: rotates the query/key chunks of its output with the cos/sin that
    :class:`PrepareRotation` left on the projection module for this forward."""

    def __init__(self, chunks: tuple[int, ...], width: int, head_dim: int):
        self.chunks, self.width, self.head_dim = chunks, width, head_dim

    def __call__(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> torch.Tensor:
        cos, sin = module._posswap_cos_sin
        pieces = list(output.split(self.width, dim=-1))
        for i in self.chunks:
            x = pieces[i]
            pieces[i] = apply_rotary(x.view(*x.shape[:-1], -1, self.head_dim), cos, sin).view(x.shape)
        return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]


class PrepareRotation:
    """Forward pre-hook on a self-attention module: positions -> cos/sin, handed to its q/k projections.

    It (re)hooks the projection modules it finds each time, so a projection that peft wrapped with LoRA (or
    that merge_and_unload put back) is rotated once, with the LoRA update included.
    """

    def __init__(self, rotary: Rotary, projections: tuple, width: int):
        self.rotary, self.projections, self.width = rotary, projections, width

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict) -> None:
        hidden = args[0] if args else kwargs["hidden_states"]
        positions = kwargs.get("position_ids")
        if positions is None:  # BERT passes none unless the user did: count from what the cache holds
            cache = kwargs.get("past_key_values")
            past = cache.get_seq_length() if cache is not None else 0
            positions = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        cos_sin = self.rotary.cos_sin(positions)
        for name, chunks in self.projections:
            projection = getattr(attention, name)
            self._hook_only(projection, chunks)
            projection._posswap_cos_sin = cos_sin

    def _hook_only(self, projection: nn.Module, chunks: tuple[int, ...]) -> None:
        if any(isinstance(h, RotateProjection) for h in projection._forward_hooks.values()):
            return
        for inner in projection.modules():  # a wrapped projection: its old hook would rotate twice
            remove_hooks(inner, RotateProjection)
        projection.register_forward_hook(RotateProjection(chunks, self.width, self.rotary.head_dim))


def install_rotary(base: nn.Module, attentions: list[nn.Module], projections: tuple, block: dict) -> Rotary:
    """Hook every self-attention module of ``base`` (idempotent); the Rotary module hangs on ``base``."""
    config = base.config
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    rotary = Rotary(block, head_dim)
    base.posswap_rotary = rotary  # a submodule: it shows in print(model), and travels with deepcopy
    for attention in attentions:
        remove_hooks(attention, PrepareRotation)
        attention.register_forward_pre_hook(PrepareRotation(rotary, projections, heads * head_dim), with_kwargs=True)
    return rotary
