"""Masked-LM loss and accuracy: BERT's 80/10/10 masking of 15% of tokens from transformers'
``DataCollatorForLanguageModeling``, seeded, so every model sees the same masks in the same windows."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import DataCollatorForLanguageModeling

from .stream import model_device


def with_special_tokens(content: torch.Tensor, tokenizer) -> torch.Tensor:
    """[CLS] content [SEP]: whatever the tokenizer adds around one sequence, found by tokenising one word with
    and without special tokens (transformers 5 tokenizers have no public ids-level method for it)."""
    bare = tokenizer("a", add_special_tokens=False)["input_ids"]
    full = tokenizer("a", add_special_tokens=True)["input_ids"]
    start = next(i for i in range(len(full)) if full[i : i + len(bare)] == bare)
    return torch.cat([torch.tensor(full[:start]), content, torch.tensor(full[start + len(bare) :])]).long()


def mask_windows(
    windows: list[torch.Tensor], tokenizer, seed: int, probability: float = 0.15
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(masked input, labels with -100 where not masked) per window. A fresh seeded collator per call: the
    same windows and seed give the same masks, whichever model is evaluated afterwards."""
    if tokenizer.mask_token_id is None:
        raise ValueError(f"{type(tokenizer).__name__} has no mask token; masked-LM evaluation needs one.")
    collator = DataCollatorForLanguageModeling(
        tokenizer, mlm=True, mlm_probability=probability, seed=seed, return_tensors="pt"
    )
    masked = []
    for window in windows:
        batch = collator([{"input_ids": window}])
        masked.append((batch["input_ids"][0], batch["labels"][0]))
    return masked


@dataclass
class MaskedScores:
    loss: float
    accuracy: float
    count: int
    nll: torch.Tensor  # per masked token
    position: torch.Tensor  # its index in the window
    window: torch.Tensor  # which window it is in


@torch.no_grad()
def masked_lm_scores(
    model: nn.Module, masked: list[tuple[torch.Tensor, torch.Tensor]], limit: int | None
) -> tuple[MaskedScores, str]:
    """Loss and accuracy over the masked tokens. A window longer than ``limit`` is read in consecutive pieces
    of the model's own length (``truncate``): the masks stay those of the whole window."""
    device = model_device(model)
    nlls, hits, positions, window_of, how = [], [], [], [], "full"
    for index, (input_ids, labels) in enumerate(masked):
        piece = len(input_ids) if limit is None else min(limit, len(input_ids))
        how = "full" if piece == len(input_ids) else "truncate"
        for start in range(0, len(input_ids), piece):
            ids, gold = input_ids[start : start + piece], labels[start : start + piece]
            keep = gold != -100
            if not keep.any():
                continue
            logits = model(input_ids=ids.unsqueeze(0).to(device)).logits[0].float().cpu()
            nlls.append(F.cross_entropy(logits[keep], gold[keep], reduction="none"))
            hits.append(logits[keep].argmax(-1) == gold[keep])
            positions.append(torch.nonzero(keep)[:, 0] + start)
            window_of.append(torch.full((int(keep.sum()),), index))
    if not nlls:
        raise ValueError("No token was masked: use longer windows or more --max-tokens.")
    nll, hit = torch.cat(nlls), torch.cat(hits)
    scores = MaskedScores(
        nll.mean().item(), hit.float().mean().item(), len(nll), nll, torch.cat(positions), torch.cat(window_of)
    )
    return scores, how
