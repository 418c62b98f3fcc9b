"""Model inputs for each objective: causal LM (GPT-2), masked LM (BERT family), and PoSE position ids.

Randomness (MLM masks, PoSE skips) is drawn in the training loop from the global torch RNG, not in the
DataLoader's collate function: accelerate's loader fetches one batch ahead, so randomness drawn there would
straddle a checkpoint and a resumed run would mask differently.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers import DataCollatorForLanguageModeling


def stack_windows(rows: list[dict[str, Any]]) -> torch.Tensor:
    return torch.tensor([row["input_ids"] for row in rows], dtype=torch.long)


def pose_position_ids(batch: int, window: int, max_length: int, offset: int = 0) -> torch.Tensor:
    """PoSE (Zhu et al. 2023): a window of ``window`` tokens in two chunks whose position ids jump, so that
    training on short windows covers every relative distance up to ``max_length``. Chunk 1 is positions
    [0, split), chunk 2 continues after a random skip; the last position stays below ``max_length``."""
    split = torch.randint(1, window, (batch, 1))
    skip = torch.randint(0, max_length - window + 1, (batch, 1))
    positions = torch.arange(window).expand(batch, -1)
    return positions + (positions >= split) * skip + offset


def batch_preparer(
    causal: bool, tokenizer: Any, mlm_probability: float, pose: tuple[int, int, int] | None
) -> Callable[[torch.Tensor], dict]:
    """input_ids (batch, length) -> the model's keyword arguments, labels included.
    ``pose`` is (window, max_length, position offset) or None."""
    masker = None if causal else DataCollatorForLanguageModeling(tokenizer, mlm=True, mlm_probability=mlm_probability)

    def prepare(ids: torch.Tensor) -> dict[str, torch.Tensor]:
        if causal:
            batch = {"input_ids": ids, "labels": ids}  # the model shifts labels itself
        else:
            special = torch.isin(ids, torch.tensor(tokenizer.all_special_ids, device=ids.device))
            inputs, labels = masker.torch_mask_tokens(ids.cpu().clone(), special_tokens_mask=special.cpu())
            batch = {"input_ids": inputs.to(ids.device), "labels": labels.to(ids.device)}
        if pose is not None:
            window, max_length, offset = pose
            batch["position_ids"] = pose_position_ids(ids.shape[0], window, max_length, offset).to(ids.device)
        return batch

    return prepare
