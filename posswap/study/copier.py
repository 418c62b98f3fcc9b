"""The copier: a small GPT-2 that copies inside its own window, built by posswap from a seeded recipe.

The repeat probe asks whether a patched model reads back past its old window. That question needs a base that
reads back *inside* it, and neither text base does (README). The copier is trained from scratch on windows that
are a random block of random length k, tiled to fill the window: the period changes from window to window, so
the only way to predict a token is to find its earlier copy by content (an induction head), and most tokens of
every window carry that signal. One copied span per window gave too little signal (the loss stayed at log V for
3,500 steps), and windows of one half repeated teach a fixed-offset lookup from the positions, not copying.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ..files import write_folder
from ..loading import quiet_transformers

COPIER_FILE = "copier.json"  # beside the weights: the recipe and the probe check that passed


@dataclass(frozen=True)
class CopierRecipe:
    """How the copier is built: a GPT-2 with a learned table of ``length`` positions over ``vocab`` random ids,
    ``steps`` of ``batch_size`` tiled windows (periods drawn in ``period``) at a constant ``lr``."""

    vocab: int = 512
    length: int = 256
    n_layer: int = 2
    n_embd: int = 128
    n_head: int = 4
    steps: int = 1000
    batch_size: int = 32
    lr: float = 1e-3
    period: tuple[int, int] = (16, 128)
    seed: int = 0


def tiled_windows(
    count: int, length: int, period: tuple[int, int], vocab: int, generator: torch.Generator
) -> torch.Tensor:
    """``count`` windows of ``length`` ids; window i is a block of k_i random ids (k_i uniform in ``period``,
    both ends included) repeated to fill it, so position j holds the block's id j mod k_i."""
    low, high = period
    if not 1 <= low <= high:
        raise ValueError(f"period must be (low, high) with 1 <= low <= high; got {period}.")
    periods = torch.randint(low, high + 1, (count, 1), generator=generator)
    blocks = torch.randint(0, vocab, (count, high), generator=generator)
    return torch.gather(blocks, 1, torch.arange(length).expand(count, length) % periods)


def new_copier(recipe: CopierRecipe):
    """The untrained copier (no dropout: the task is exact copying), initialised from ``recipe.seed``."""
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(
        vocab_size=recipe.vocab,
        n_positions=recipe.length,
        n_embd=recipe.n_embd,
        n_layer=recipe.n_layer,
        n_head=recipe.n_head,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(recipe.seed)
    model = GPT2LMHeadModel(config)
    model.loss_type = "ForCausalLM"  # else transformers warns that loss_type=None is unrecognized
    return model


def make_optimizer(model, lr: float, position_lr: float | None = None) -> torch.optim.Optimizer:
    """AdamW as the copier and the copying study train: betas (0.9, 0.98), no weight decay. ``position_lr``
    puts the position parameters (tables, T5 buckets, TUPE's projections) in a group of their own."""
    from ..training.trainable import position_parameter_names

    named = dict(model.named_parameters())
    special = set(position_parameter_names(model)) if position_lr is not None else set()
    groups = [{"params": [p for n, p in named.items() if n not in special and p.requires_grad], "lr": lr}]
    if special:
        groups.append({"params": [named[n] for n in sorted(special) if named[n].requires_grad], "lr": position_lr})
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.98), weight_decay=0.0)


def train_step(model, optimizer, ids: torch.Tensor, distill: tuple | None = None) -> float:
    """One step of next-token loss on ``ids``, gradients clipped to norm 1. ``distill``: (teacher, length, weight):
    plus weight x KL(teacher || model) over each window's first ``length`` tokens, which the (unpatched, causal)
    teacher reads as the model does."""
    from ..training.distill import token_kl

    output = model(input_ids=ids, labels=ids)
    loss = output.loss
    if distill is not None:
        teacher, length, weight = distill
        with torch.no_grad():
            target = teacher(input_ids=ids[:, :length]).logits
        loss = loss + weight * token_kl(target, output.logits[:, :length], 1.0)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss.item()


def train_copier(recipe: CopierRecipe, steps: int | None = None, progress: bool = True):
    """The copier after ``steps`` (default: the recipe's) of its training, and the loss of each step. The data
    come from their own generator (seed + 1), so the same recipe gives the same windows in the same order."""
    model = new_copier(recipe).train()
    optimizer = make_optimizer(model, recipe.lr)
    generator = torch.Generator().manual_seed(recipe.seed + 1)
    steps = recipe.steps if steps is None else steps
    losses = []
    with tqdm(range(steps), desc="copier: learning to copy", disable=not progress) as bar:
        for _ in bar:
            losses.append(
                train_step(
                    model,
                    optimizer,
                    tiled_windows(recipe.batch_size, recipe.length, recipe.period, recipe.vocab, generator),
                )
            )
            bar.set_postfix(loss=f"{losses[-1]:.2f}", refresh=False)
    return model.eval(), losses


FINGERPRINT_STEPS = 3


def fingerprint(recipe: CopierRecipe) -> dict:
    """What the recipe's first steps give: their losses and the sum of |weights| after them. Recorded beside a
    shipped copier, recomputed by a test: the recipe in the code is the one that made the shipped weights."""
    model, losses = train_copier(recipe, steps=FINGERPRINT_STEPS, progress=False)
    return {
        "steps": FINGERPRINT_STEPS,
        "losses": losses,
        "weight_abs_sum": sum(p.detach().abs().sum().item() for p in model.parameters()),
    }


def load_copier(folder: Path, recipe: CopierRecipe):
    """The copier saved in ``folder`` by this recipe, or None when there is none (or another recipe made it)."""
    from transformers import GPT2LMHeadModel

    record = Path(folder) / COPIER_FILE
    if not record.is_file() or json.loads(record.read_text()).get("recipe") != json.loads(json.dumps(asdict(recipe))):
        return None
    with quiet_transformers():
        model = GPT2LMHeadModel.from_pretrained(folder)
    model.loss_type = "ForCausalLM"
    return model.eval()


SHIPPED = Path(__file__).resolve().parent.parent / "data" / "copier"  # the default recipe's copier, as built here


def copier(
    folder: Path,
    recipe: CopierRecipe = CopierRecipe(),
    check=None,
    progress: bool = True,
    shipped: bool = True,
    rebuild: bool = False,
):
    """The copier of ``recipe``, kept in ``folder``: found there (unless ``rebuild``); else, with ``shipped``, the
    one posswap ships when that recipe made it; else trained (bit-identical to the shipped one on 2 CPU threads).
    A new one is checked with ``check(model)`` (returns what it measured; raises when the model does not copy)
    before it is written there whole. Returns (model, record)."""
    found = None if rebuild else load_copier(folder, recipe)
    if found is not None:
        return found, json.loads((Path(folder) / COPIER_FILE).read_text())
    ready = load_copier(SHIPPED, recipe) if shipped and not rebuild else None
    if ready is not None:
        model, record = ready, json.loads((SHIPPED / COPIER_FILE).read_text())
    else:
        model, _ = train_copier(recipe, progress=progress)
        record = {"recipe": asdict(recipe), "fingerprint": fingerprint(recipe) if recipe == CopierRecipe() else None}
    record["check"] = check(model) if check is not None else record.get("check")

    def write(staging: Path) -> None:
        with quiet_transformers():
            model.save_pretrained(staging)
        (staging / COPIER_FILE).write_text(json.dumps(record, indent=2) + "\n")

    write_folder(folder, write, overwrite=True, flag="copier folder")
    return model, json.loads(json.dumps(record))
