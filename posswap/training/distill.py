"""``train.distill``: the model as the recipe found it, before its patch, as a frozen teacher for the MLM/CLM loop.

The patched model learns to read further from the recipe's own objective at the new length; beside it, on the
part of each window the original could read (its first ``original length`` tokens), it is pulled towards what
the original predicted there: loss = objective + ``weight`` x T^2 x KL(teacher || student), per token, at
temperature T (Hinton et al. 2015; T^2 keeps the gradient's scale as T changes).

Which tokens the teacher sees: the prefix of each training window, ``min(window, original length)`` tokens,
with the batch's own inputs (an MLM batch's masked tokens included). No second cut of the data, so the teacher
adds no randomness and a run with ``weight: 0`` (no teacher at all) is today's run, bit for bit.

- Causal LM: a causal model's first L logits read only the first L tokens, so the student's logits on the prefix
  are the first L rows of its forward on the whole window: no second student forward. KL over every position.
- Masked LM (or PoSE position ids, which jump inside the prefix): the student runs again on the truncated batch
  (same masks, positions from 0, as the teacher reads it). KL over the masked positions, where the objective is.

``attention_layers`` adds, with the same weight, the attention maps of those layers on the prefix (TinyBERT's
attention transfer): KL(teacher's row || student's row) for every query, mean over batch, heads and queries. Maps
exist only in eager attention, so the teacher loads with it and the student reads the prefix once more through its
eager kernel, without dropout (eager returns the maps after dropout); without the key nothing of this runs.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

from ..config import check_number
from ..loading import from_pretrained, resolve_model_id
from ..portable.posswap_architectures import find_sites
from ..portable.posswap_attention import BIAS_IMPLEMENTATIONS

# A study variant's or recipe's name with this suffix: the same one with the unpatched model as teacher.
DISTILLED = "-distill"


@dataclass
class DistillSpec:
    weight: float = field(
        default=0.0,
        metadata={"help": "Weight of the KL to the unpatched model on its own windows (0: no teacher is loaded)."},
    )
    temperature: float = field(default=1.0, metadata={"help": "Softmax temperature of teacher and student (> 0)."})
    attention_layers: list[int] = field(
        default_factory=list,
        metadata={
            "help": "Layers (from 0) whose attention maps on the teacher's windows the student also matches (KL per "
            "query, same weight); []: the logits only."
        },
    )

    def validate(self) -> None:
        check_number("train.distill.weight", self.weight, minimum=0)
        check_number("train.distill.temperature", self.temperature, above=0)
        layers = self.attention_layers
        if not isinstance(layers, list) or not all(type(i) is int and i >= 0 for i in layers):
            raise ValueError(f"train.distill.attention_layers must be a list of layer numbers >= 0, got {layers!r}.")
        if len(set(layers)) != len(layers):
            raise ValueError(f"train.distill.attention_layers names a layer twice: {layers}.")


def token_kl(teacher: torch.Tensor, student: torch.Tensor, temperature: float, keep: torch.Tensor | None = None):
    """Mean over tokens (those where ``keep`` is true) of KL(teacher || student) at ``temperature``, in fp32."""
    target = F.log_softmax(teacher.float() / temperature, dim=-1)
    kl = F.kl_div(F.log_softmax(student.float() / temperature, dim=-1), target, log_target=True, reduction="none")
    kl = kl.sum(-1)
    if keep is None:
        return kl.mean()
    keep = keep.to(kl.dtype)
    return (kl * keep).sum() / keep.sum().clamp(min=1)  # a prefix without a masked token adds nothing


def attention_kl(teacher_maps, student_maps, layers: list[int]) -> torch.Tensor:
    """Mean over ``layers`` of KL(teacher's row || student's row) per query (mean over batch, heads, queries), fp32;
    a zero in the teacher's row (a causal mask's) adds nothing."""
    terms = []
    for layer in layers:
        p, q = teacher_maps[layer].float(), student_maps[layer].float()
        terms.append((torch.xlogy(p, p) - p * torch.log(q.clamp_min(1e-12))).sum(-1).mean())
    return torch.stack(terms).mean()


@contextmanager
def maps_pass(model):
    """For the calls inside: the model's attention through its eager kernel (posswap's bias methods have their
    own), the only one that returns the maps, and no dropout (eager returns the maps after it, as the teacher's are
    not)."""
    config, training = model.config, model.training
    current = config._attn_implementation
    biased = current in BIAS_IMPLEMENTATIONS.values()
    config._attn_implementation = BIAS_IMPLEMENTATIONS["eager"] if biased else "eager"
    model.eval()
    try:
        yield
    finally:
        config._attn_implementation = current
        model.train(training)


def load_teacher(recipe: Any, causal: bool, device: torch.device):
    """The recipe's checkpoint as it is, without the recipe's patch: frozen, in eval mode, on ``device``. Its own
    RNG: a head the checkpoint lacks would draw from the run's (and move the student's dropout and masks). With
    ``attention_layers``, in eager attention (the maps)."""
    with torch.random.fork_rng(devices=[]):
        model_class = AutoModelForCausalLM if causal else AutoModelForMaskedLM
        kwargs = {"attn_implementation": "eager"} if recipe.train.distill.attention_layers else {}
        teacher = from_pretrained(resolve_model_id(recipe.model), model_class=model_class, **kwargs)
    return teacher.requires_grad_(False).eval().to(device)


def check_attention_layers(recipe: Any) -> None:
    """Before any work: ``train.distill.attention_layers`` are layers of the recipe's model (its config alone)."""
    layers = recipe.train.distill.attention_layers if recipe.train.distill.weight else []
    if not layers:
        return
    depth = AutoConfig.from_pretrained(resolve_model_id(recipe.model)).num_hidden_layers
    if max(layers) >= depth:
        raise ValueError(
            f"train.distill.attention_layers: {max(layers)} is not a layer of {recipe.model} (layers 0 to {depth - 1})."
        )


def make_distiller(recipe: Any, causal: bool, accelerator: Any) -> Distiller | None:
    """The run's distiller, or None (no teacher loaded) when ``train.distill.weight`` is 0."""
    spec = recipe.train.distill
    if spec.weight == 0:
        return None
    teacher = load_teacher(recipe, causal, accelerator.device)
    return Distiller(teacher, find_sites(teacher).max_length, spec, causal, accelerator)


class Distiller:
    """Adds the teacher's term to each micro-batch's loss and keeps what it cost for the step's log line."""

    def __init__(self, teacher, length: int, spec: DistillSpec, causal: bool, accelerator: Any):
        self.teacher, self.length, self.spec, self.causal, self.accelerator = teacher, length, spec, causal, accelerator
        self.megabytes = sum(p.numel() * p.element_size() for p in teacher.parameters()) / 2**20
        self._reset()
        self.logged: dict[str, float] = {}

    def _reset(self) -> None:
        self.kl_sum, self.micro, self.teacher_seconds, self.started = 0.0, 0, 0.0, time.perf_counter()
        self.attention_sum = 0.0

    def start_step(self) -> None:
        self.started = time.perf_counter()

    def loss(self, output, model, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        """``output.loss`` (the objective at the new length) + weight x T^2 x KL on the teacher's prefix."""
        length = min(self.length, batch["input_ids"].shape[1])
        ids = batch["input_ids"][:, :length]
        layers = self.spec.attention_layers
        teacher = self._teacher(ids, maps=bool(layers))
        if self.causal and "position_ids" not in batch:
            student_logits, keep = output.logits[:, :length], None
        else:
            student_logits = model(input_ids=ids).logits
            keep = None if self.causal else batch["labels"][:, :length] != -100
        t = self.spec.temperature
        kl = token_kl(teacher.logits, student_logits, t, keep)
        self.kl_sum += kl.detach().float()
        self.micro += 1
        loss = output.loss + self.spec.weight * t * t * kl
        if layers:  # the prefix once more, for its maps
            with maps_pass(self.accelerator.unwrap_model(model)):
                student = model(input_ids=ids, output_attentions=True)
            maps = attention_kl(teacher.attentions, student.attentions, layers)
            self.attention_sum += maps.detach().float()
            loss = loss + self.spec.weight * maps
        return loss

    def _teacher(self, ids: torch.Tensor, maps: bool):
        start = time.perf_counter()
        with torch.no_grad(), self.accelerator.autocast():
            out = self.teacher(input_ids=ids, output_attentions=maps)
        if ids.device.type == "cuda":
            torch.cuda.synchronize(ids.device)  # the seconds of the forward, not of its launch
        self.teacher_seconds += time.perf_counter() - start
        return out

    def end_step(self) -> None:
        """After an optimizer step (every process: a collective): the step's mean KL and the teacher's cost."""
        step_seconds = time.perf_counter() - self.started
        micro = max(self.micro, 1)
        stats = [float(self.kl_sum) / micro, self.teacher_seconds, step_seconds, float(self.attention_sum) / micro]
        stats = torch.tensor(stats).to(self.accelerator.device)
        kl, teacher, step, maps = self.accelerator.reduce(stats, reduction="mean").tolist()
        self.logged = {
            "distill_kl": kl,
            **({"distill_attention_kl": maps} if self.spec.attention_layers else {}),
            "teacher_s": teacher,
            "teacher_share": teacher / step if step > 0 else 0.0,
            "teacher_mb": round(self.megabytes, 1),
        }
        self._reset()
