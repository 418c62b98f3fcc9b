"""``rope``: rotary position embedding on queries and keys of every self-attention layer.

Keys are rotated as the projection produces them, before the attention module writes them to the KV
cache (as Llama's attention does), so cached keys keep the rotation of their own positions and the
attention kernel (SDPA, flex, eager: whatever the model uses) runs unchanged. A forward pre-hook on each
attention module turns its ``position_ids`` into cos/sin; forward hooks on the q/k projections rotate.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from ..absolute import ABSOLUTE_CHOICES, apply_absolute, check_absolute, planned_table_weight
from ..architectures import Sites
from ..backends import check_backend, select_backend, validate_backend
from ..config import PositionConfig, check_choice
from ..functional import apply_rotary, rope_frequencies, rotary_cos_sin
from ..patching import patched_config
from ..registry import register_method

SCALINGS = (None, "linear", "dynamic", "yarn")

# Per architecture: (projection attribute on the attention module, which hidden-size chunks of its output
# are queries or keys). GPT-2's fused c_attn gives [q | k | v].
PROJECTIONS = {
    True: (("c_attn", (0, 1)),),  # causal: GPT-2
    False: (("query", (0,)), ("key", (0,))),  # BERT family
}


@dataclass
class RopeConfig(PositionConfig):
    method = "rope"

    theta: float = field(default=10000.0, metadata={"help": "RoPE base (theta)."})
    rotary_dim: float | int | None = field(
        default=None,
        metadata={"help": "Head dims rotated: a fraction in (0, 1] or an even number of dims; default all."},
    )
    scaling: str | None = field(default=None, metadata={"help": "None, linear, dynamic or yarn (transformers' rope functions)."})
    factor: float | None = field(
        default=None, metadata={"help": "Scaling factor; default max_length / the model's original length."}
    )
    absolute: str = field(default="drop", metadata={"help": "drop: remove the learned table; keep: keep it, extended by copy."})
    backend: str | None = field(default=None, metadata={"help": "Attention kernel: sdpa, flex or eager; default: as loaded."})

    def validate(self) -> None:
        from ..config import check_number

        super().validate()
        check_number("theta", self.theta, above=1)
        if self.rotary_dim is not None:
            r = self.rotary_dim
            ok_fraction = isinstance(r, float) and 0 < r <= 1
            ok_count = isinstance(r, int) and not isinstance(r, bool) and r > 0 and r % 2 == 0
            if not (ok_fraction or ok_count):
                raise ValueError(f"rotary_dim must be a fraction in (0, 1] or an even positive number of dims, got {r!r}.")
        check_choice("scaling", self.scaling, SCALINGS)
        if self.factor is not None:
            if self.scaling is None:
                raise ValueError("factor only applies with scaling='linear', 'dynamic' or 'yarn'; set scaling or drop factor.")
            check_number("factor", self.factor, minimum=1)
        check_choice("absolute", self.absolute, ABSOLUTE_CHOICES)
        validate_backend(self.backend)


class Rotary(nn.Module):
    """Frequencies for one model, and cos/sin for the positions of the current forward (shared by layers)."""

    def __init__(self, config: RopeConfig, head_dim: int, original_length: int):
        super().__init__()
        self.head_dim = head_dim
        self.rotary_dim = resolve_rotary_dim(config.rotary_dim, head_dim)
        self.original_length = original_length
        self.config = config
        inv_freq, self.scale = self._frequencies(seq_len=None)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._last: tuple | None = None

    def _frequencies(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        c = self.config
        factor = c.factor if c.factor is not None else c.max_length / self.original_length
        return rope_frequencies(self.head_dim, self.rotary_dim, c.theta, c.scaling, max(factor, 1.0), self.original_length, seq_len)

    def cos_sin(self, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Every layer gets the same position_ids tensor in one forward: compute once.
        if self._last is not None and self._last[0] is position_ids:
            return self._last[1]
        inv_freq = self.inv_freq
        if self.config.scaling == "dynamic":  # frequencies follow the longest position seen (NTK-aware)
            seq_len = int(position_ids.max()) + 1
            if seq_len > self.original_length:
                inv_freq = self._frequencies(seq_len)[0].to(self.inv_freq.device)
        result = rotary_cos_sin(inv_freq, position_ids, self.scale)
        self._last = (position_ids, result)
        return result


def resolve_rotary_dim(rotary_dim: float | int | None, head_dim: int) -> int:
    if rotary_dim is None:
        return head_dim
    dims = int(round(rotary_dim * head_dim)) if isinstance(rotary_dim, float) else rotary_dim
    if dims % 2 or not 0 < dims <= head_dim:
        raise ValueError(f"rotary_dim={rotary_dim!r} gives {dims} of {head_dim} head dims; it must be even and at most {head_dim}.")
    return dims


class RotaryAttentionHooks:
    """Hooks for one self-attention module: positions -> cos/sin before it runs, rotation on its q/k projections."""

    def __init__(self, attention: nn.Module, rotary: Rotary, projections: tuple, width: int):
        self.rotary = rotary
        self.projections = projections
        self.width = width  # heads * head_dim: one chunk of a projection's output
        self.cos_sin: tuple[torch.Tensor, torch.Tensor] | None = None
        self.hooked: dict[str, tuple[nn.Module, object]] = {}
        attention.register_forward_pre_hook(self.before_attention, with_kwargs=True)
        self.attach(attention)

    def attach(self, attention: nn.Module) -> None:
        """Hook the current projection modules (again, if peft or the user swapped one for a wrapper)."""
        for name, chunks in self.projections:
            module = getattr(attention, name)
            if name in self.hooked and self.hooked[name][0] is module:
                continue
            if name in self.hooked:
                self.hooked[name][1].remove()
            handle = module.register_forward_hook(lambda m, i, out, chunks=chunks: self.rotate(out, chunks))
            self.hooked[name] = (module, handle)

    def before_attention(self, attention: nn.Module, args: tuple, kwargs: dict) -> None:
        self.attach(attention)
        hidden = args[0] if args else kwargs["hidden_states"]
        positions = kwargs.get("position_ids")
        if positions is None:  # BERT passes none unless the user did: count from what the cache holds
            cache = kwargs.get("past_key_values")
            past = cache.get_seq_length() if cache is not None else 0
            positions = torch.arange(past, past + hidden.shape[1], device=hidden.device)[None]
        self.cos_sin = self.rotary.cos_sin(positions)

    def rotate(self, output: torch.Tensor, chunks: tuple[int, ...]) -> torch.Tensor:
        cos, sin = self.cos_sin
        head_dim = self.rotary.head_dim
        pieces = list(output.split(self.width, dim=-1))
        for i in chunks:
            x = pieces[i]
            pieces[i] = apply_rotary(x.view(*x.shape[:-1], -1, head_dim), cos, sin).view(x.shape)
        return torch.cat(pieces, dim=-1) if len(pieces) > 1 else pieces[0]


def check(model: nn.Module, sites: Sites, config: RopeConfig) -> None:
    check_absolute(sites, config.absolute)
    check_backend(model, config.backend)
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    resolve_rotary_dim(config.rotary_dim, head_dim)
    if any(hasattr(a, "_posswap_rotary_hooks") for a in sites.self_attentions()) and patched_config(model) != config:
        raise ValueError("This model already carries RoPE with other settings; start from the original checkpoint.")


def apply(model: nn.Module, sites: Sites, config: RopeConfig) -> None:
    heads = model.config.num_attention_heads
    head_dim = model.config.hidden_size // heads
    original = model.config.posswap["original_length"] if getattr(model.config, "posswap", None) else sites.max_length
    rotary = Rotary(config, head_dim, original).to(next(model.parameters()).device)
    new_table = planned_table_weight(sites, config.absolute, config.max_length)
    # Already hooked only when the same config is applied again (check refuses other settings).
    attentions = [a for a in sites.self_attentions() if not hasattr(a, "_posswap_rotary_hooks")]

    apply_absolute(sites, config.absolute, new_table)
    sites.base.posswap_rotary = rotary  # a submodule, so model.to(device) moves its frequencies
    for attention in attentions:
        attention._posswap_rotary_hooks = RotaryAttentionHooks(attention, rotary, PROJECTIONS[sites.arch.causal], heads * head_dim)
    select_backend(model, config.backend)


register_method(RopeConfig, check, apply)
