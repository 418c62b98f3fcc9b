"""RoPE at run time: cos/sin from each attention module's ``position_ids``, rotation on its q/k projections.

Keys are rotated as the projection produces them, before the attention module writes them to the KV cache
(as Llama's attention does), so cached keys keep the rotation of their own positions and the attention kernel
(SDPA, flex, eager) runs unchanged. Hooks are callable objects, not closures, so ``copy.deepcopy``, pickling and
DataParallel replicas rotate with their own.

Per-call state is never written to a module (a model served from several threads gives each call its own output):
cos/sin are computed once per forward and kept in the call's state (``posswap_state.py``), which transformers
hands to every attention module in its kwargs; the attention's pre-hook hands them to its q/k projections' hooks
through a per-thread table (the projection is called in the same thread, inside the attention's forward), and the
attention's forward hook takes them out again.

Frequencies are computed on first use, per device, in fp32: never a buffer, so building the model on the meta
device (transformers' loading) and ``model.to(torch.bfloat16)`` leave them exact.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

from .posswap_functional import rope_frequencies, rotary_cos_sin, rotate_in_place, signed_sin
from .posswap_hooks import find_hooks, passed_cache, remove_hooks
from .posswap_state import install_call_state, shared

# projection module -> (cos, sin) of the attention call running in this thread; set by PrepareRotation, read by
# RotateProjection, removed by EndRotation. Module-level (a thread-local cannot be deep-copied or pickled).
_HANDOFF = threading.local()
# Serialises (re)hooking a projection that peft wrapped, so two first calls cannot hook it twice.
_HOOKING = threading.Lock()
ROPE_TYPES = (None, "linear", "dynamic", "yarn")  # transformers' rope_type names: RopeConfig's choices
ROPE_INITS = ("fit",)  # RopeConfig.init besides None: first-layer q/k biases fitted to the dropped table


def _handoff() -> dict:
    table = getattr(_HANDOFF, "table", None)
    if table is None:
        table = _HANDOFF.table = {}
    return table


def resolve_rotary_dim(rotary_dim: float | int | None, head_dim: int) -> int:
    if rotary_dim is None:
        return head_dim
    dims = int(round(rotary_dim * head_dim)) if isinstance(rotary_dim, float) else rotary_dim
    if dims % 2 or not 0 < dims <= head_dim:
        raise ValueError(
            f"rotary_dim={rotary_dim!r} gives {dims} of {head_dim} head dims; it must be even and at most {head_dim}."
        )
    return dims


class Rotary(nn.Module):
    """Frequencies of one model (shared by its layers) from the saved posswap block; no parameters, no buffers."""

    def __init__(self, block: dict, head_dim: int):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = resolve_rotary_dim(block.get("rotary_dim"), head_dim)
        self.theta = float(block.get("theta", 10000.0))
        self.rope_type = block.get("rope_type")
        self.original_length = block["original_length"]
        factor = block.get("factor")
        self.factor = max(factor if factor is not None else block["max_length"] / self.original_length, 1.0)
        # Filled on first use per device; every thread would store the same values.
        self._inv_freq: dict[torch.device, tuple[torch.Tensor, float]] = {}

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
            self.head_dim, self.rotary_dim, self.theta, self.rope_type, self.factor, self.original_length, seq_len
        )

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """fp32 (batch or 1, n, rotary_dim) cos and sin of ``position_ids``; a pure function of them."""
        inv_freq, scale = self.frequencies(position_ids.device, self.stretched_length(position_ids))
        return rotary_cos_sin(inv_freq, position_ids, scale)

    def stretched_length(self, positions: torch.Tensor) -> int | None:
        """The length dynamic scaling stretches the frequencies to (NTK-aware): the longest position seen, once
        past the original length; None otherwise (and for every other rope_type)."""
        longest = int(positions.max()) + 1 if self.rope_type == "dynamic" else 0
        return longest if longest > self.original_length else None

    def extra_repr(self) -> str:
        return f"rotary_dim={self.rotary_dim}, theta={self.theta}, rope_type={self.rope_type}, factor={self.factor}"


class RotateProjection:
    """Forward hook on a q/k projection: rotates the query/key chunks of its output, in place, with the cos/sin
    that :class:`PrepareRotation` handed over for the attention call running in this thread. A projection called
    outside its attention module (no positions) is left as it is."""

    def __init__(self, chunks: tuple[int, ...], width: int, head_dim: int):
        if list(chunks) != list(range(chunks[0], chunks[0] + len(chunks))):
            raise ValueError(f"q/k chunks {chunks} must be consecutive: they are rotated as one block.")
        self.chunks, self.width, self.head_dim = chunks, width, head_dim

    def __call__(self, module: nn.Module, inputs: tuple, output: torch.Tensor) -> None:
        cos_sin = _handoff().get(module)
        if cos_sin is None:
            return
        start, count = self.chunks[0] * self.width, len(self.chunks)
        block = output[..., start : start + count * self.width]  # q and k of GPT-2's fused c_attn: one block
        rotate_in_place(block.view(*output.shape[:-1], count, -1, self.head_dim), *cos_sin)


class PrepareRotation:
    """Forward pre-hook on a self-attention module: positions -> cos/sin (once per forward, in the call's state),
    handed to its q/k projections for this call.

    It checks that the projection modules it finds are hooked, so a projection that peft wrapped with LoRA (or
    that merge_and_unload put back) is rotated once, with the LoRA update included.
    """

    def __init__(self, rotary: Rotary, projections: tuple, width: int):
        self.rotary, self.projections, self.width = rotary, projections, width

    def __call__(self, attention: nn.Module, args: tuple, kwargs: dict) -> None:
        positions = kwargs.get("position_ids")
        if positions is None:  # BERT passes none unless the user did: count from what this layer's cache holds
            hidden = args[0] if args else kwargs["hidden_states"]
            cache = passed_cache(kwargs)
            past = cache.get_seq_length(getattr(attention, "layer_idx", None) or 0) if cache is not None else 0
            key = (past, hidden.shape[1], hidden.device)
            cos_sin = shared(
                kwargs,
                self.rotary,
                key,
                lambda: self.signed(torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]),
            )
        else:
            cos_sin = shared(kwargs, self.rotary, (positions,), lambda: self.signed(positions))
        table = _handoff()
        for name, chunks in self.projections:
            projection = getattr(attention, name)
            if not find_hooks(projection, RotateProjection):
                self.hook(projection, chunks)
            table[projection] = cos_sin

    def signed(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and the signed sin of ``positions`` (once per forward: every layer rotates with them)."""
        cos, sin = self.rotary.cos_sin(positions)
        return cos, signed_sin(sin)

    def hook(self, projection: nn.Module, chunks: tuple[int, ...]) -> None:
        with _HOOKING:
            if find_hooks(projection, RotateProjection):
                return  # another thread got here first
            for inner in projection.modules():  # a wrapped projection: its old hook would rotate twice
                remove_hooks(inner, RotateProjection)
            projection.register_forward_hook(RotateProjection(chunks, self.width, self.rotary.head_dim))


class EndRotation:
    """Forward hook on a self-attention module (also on errors): takes its projections' cos/sin out of this
    thread's table, so that nothing outlives the call."""

    def __init__(self, projections: tuple):
        self.projections = projections

    def __call__(self, attention: nn.Module, *args) -> None:
        table = _handoff()
        for name, _ in self.projections:
            table.pop(getattr(attention, name), None)


def install_rotary(base: nn.Module, attentions: list[nn.Module], projections: tuple, block: dict) -> Rotary:
    """Hook every self-attention module of ``base`` (idempotent); the Rotary module hangs on ``base``."""
    config = base.config
    heads = config.num_attention_heads
    head_dim = config.hidden_size // heads
    rotary = Rotary(block, head_dim)
    base.posswap_rotary = rotary  # a submodule: it shows in print(model), and travels with deepcopy
    for attention in attentions:
        remove_hooks(attention, PrepareRotation)
        remove_hooks(attention, EndRotation)
        prepare = PrepareRotation(rotary, projections, heads * head_dim)
        attention.register_forward_pre_hook(prepare, with_kwargs=True)
        attention.register_forward_hook(EndRotation(projections), always_call=True)
        for name, chunks in projections:  # hooked now, not by the first calls (which may run in several threads)
            if not find_hooks(getattr(attention, name), RotateProjection):
                prepare.hook(getattr(attention, name), chunks)
    install_call_state(base)  # each forward's cos/sin live in that call's state
    return rotary
