"""Passkey retrieval (Mohtashami & Jaggi, 2023, "Landmark Attention"): a key hidden at a given depth in
filler text, then the question. A trial passes when greedy decoding would produce the key's tokens, which
is read off one forward pass over prompt + key (the argmax at every key position is the key token)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .stream import model_device

TASK = (
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
    "I will quiz you about the important information there."
)
FILLER = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
QUESTION = " What is the pass key? The pass key is"
DEPTHS = (0.0, 0.25, 0.5, 0.75, 1.0)


def info(key: int) -> str:
    return f" The pass key is {key}. Remember it. {key} is the pass key."


@dataclass
class PasskeyPrompt:
    ids: torch.Tensor  # prompt followed by the answer: exactly the requested length
    answer_start: int  # index of the first answer token
    key: int
    info_start: int  # index of the first token of the key sentence

    @property
    def prompt_ids(self) -> torch.Tensor:
        return self.ids[: self.answer_start]


def _encode(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]


def shortest_prompt(tokenizer, key: int = 99_999) -> int:
    """Tokens of a prompt with no filler: shorter lengths cannot hold the task, key and question."""
    return sum(len(_encode(tokenizer, text)) for text in (TASK, info(key), QUESTION, f" {key}"))


def build_prompt(tokenizer, length: int, depth: float, key: int) -> PasskeyPrompt:
    """A prompt of ``length`` tokens counting the answer. Filler is cut at token level, so the length is
    exact, and the key sentence starts ``depth`` (0 = first, 1 = last) of the way through the filler."""
    if not 0.0 <= depth <= 1.0:
        raise ValueError(f"Passkey depth must be between 0 and 1; got {depth}.")
    task, key_sentence, question = _encode(tokenizer, TASK), _encode(tokenizer, info(key)), _encode(tokenizer, QUESTION)
    answer = _encode(tokenizer, f" {key}")
    filler_length = length - len(task) - len(key_sentence) - len(question) - len(answer)
    if filler_length < 0:
        raise ValueError(f"A passkey prompt needs at least {length - filler_length} tokens; got length {length}.")
    one_filler = _encode(tokenizer, FILLER)
    filler = (one_filler * (filler_length // len(one_filler) + 1))[:filler_length]
    before = round(depth * filler_length)
    ids = task + filler[:before] + key_sentence + filler[before:] + question
    return PasskeyPrompt(torch.tensor(ids + answer), len(ids), key, len(task) + before)


@torch.no_grad()
def passkey_found(model: nn.Module, prompt: PasskeyPrompt, limit: int | None) -> bool:
    """Whether greedy decoding gives the key. Past ``limit`` the model reads only its last ``limit`` tokens
    (what a sliding or truncated window sees when it answers)."""
    ids = prompt.ids[:-1]  # the last answer token is only a target
    cut = 0 if limit is None else max(0, len(ids) - limit)
    logits = model(input_ids=ids[cut:].unsqueeze(0).to(model_device(model))).logits[0].cpu()
    first = prompt.answer_start - 1 - cut  # logits here predict the first answer token
    predicted = logits[first:].argmax(-1)
    return bool(torch.equal(predicted, prompt.ids[prompt.answer_start :]))


def random_keys(trials: int, seed: int) -> list[int]:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(10_000, 100_000, (trials,), generator=generator).tolist()
