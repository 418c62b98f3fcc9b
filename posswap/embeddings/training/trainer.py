"""``posswap train`` for a recipe with an ``embedding:`` block: a sentence-transformers model patched to its new
length, then trained with sentence-transformers' own trainer and ranking loss on (passage, document) pairs cut
from the training text, read top to bottom:

load (a sentence-transformers folder; a plain encoder gets mean pooling) + patch -> what trains, dropout ->
pairs (:mod:`.data`) -> MultipleNegativesRankingLoss (cached: many in-batch negatives, a few documents
at a time) -> SentenceTransformerTrainer (cosine schedule, no checkpoints: the trainer would pickle its optimizer)
-> the model saved whole as a sentence-transformers folder, atomically -> log.jsonl.

Over an earlier run's model, the run writes in the folder's pending folder and replaces the earlier run's model
and record together at the end (:mod:`posswap.training.run_folder`). Ctrl-C stops it within a module's backward, not at the end
of a step's (:func:`interruptible_backward`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
from collections.abc import Iterator
from pathlib import Path

import datasets
import torch
from torch import nn
from transformers import ProgressCallback, TrainerCallback, get_cosine_schedule_with_warmup

from ...files import write_folder
from ...loading import load_sentence_transformer, resolve_model_id
from ...patching import patch, patched_config
from ...sentence_models import save, transformer_module
from ...training.optimizer import MAX_GRAD_NORM, parameter_groups
from ...training.recipe import Recipe
from ...training.run_folder import LOG, check_before_work, commit, local_source, push_run, start_record
from ...training.trainable import enable_checkpointing, position_parameter_names, select_trainable
from .chunks import LateChunkLoss, chunk_teacher_rows
from .context import ContextChunkLoss, check_context_pairs, context_rows
from .data import document_pairs
from .teacher import TeacherLoss, teacher_rows

FLAG = "train.output_dir: model folder"


def train_embedding(recipe: Recipe, raw, resume: bool, callbacks, overwrite: bool, force: bool) -> Path:
    """Run an embedding recipe; returns the folder of the trained sentence-transformers model."""
    t, e = recipe.train, recipe.embedding
    if resume or force:
        raise ValueError("--resume / --force: an embedding recipe keeps no checkpoints to resume; run it again.")
    _, work = check_before_work(recipe, False, overwrite, False)  # the model folder, old checkpoints, a Hub login
    run_dir, final_dir = Path(t.output_dir), Path(t.output_dir) / "model"
    log = JsonLog(work / LOG, callbacks)
    model = train_once(recipe, t.seed, work, log, raw, first=True)
    if e.soup > 1:  # each run as a one-run recipe with train.seed + i would train it; one more in memory at a time
        others = (train_once(recipe, t.seed + i, work, log, raw).state_dict() for i in range(1, e.soup))
        model.load_state_dict(mean_weights(itertools.chain([model.state_dict()], others)))
    model.eval()
    local = local_source(recipe.model)
    write_folder(work / "model", lambda folder: save(model, folder), overwrite=overwrite, source=local, flag=FLAG)
    with contextlib.suppress(OSError):  # the trainer's own folder, empty: it saves nothing (save_strategy "no")
        (work / "trainer").rmdir()
    commit(run_dir, work)  # over an earlier model: it and its record go together for this run's
    if recipe.push_to_hub:
        push_run(recipe, final_dir, run_dir, describe=False)  # sentence-transformers' card describes the training
    return final_dir


def train_once(recipe: Recipe, seed: int, run_dir: Path, log: JsonLog, raw, first: bool = False) -> nn.Module:
    """One training of the recipe's model with ``seed`` (its pairs, order and teacher texts), writing in
    ``run_dir`` (the run folder, or its pending folder); the ``first`` run writes the recipe's files and starts the
    log, once its inputs are known to be good."""
    from sentence_transformers import SentenceTransformerTrainer

    t, e = recipe.train, recipe.embedding
    torch.manual_seed(seed)
    model = load_sentence_model(recipe)
    old_limit = transformer_module(model).max_seq_length
    chunked = chunk_teacher_rows(  # first: it checks the model's pooling before either teacher encodes
        model, recipe.data.train, e.chunk_teacher, max(e.document_lengths), seed, recipe.data.text_column
    )
    taught = teacher_rows(model, recipe.data.train, e.teacher, e.anchor_words, seed, recipe.data.text_column)
    patch_as_the_recipe_says(model, recipe)
    check_document_lengths(model, e.document_lengths)
    transformer = transformer_module(model).auto_model
    if e.dropout is not None:  # SDPA's backward with dropout on CPU is ~4x slower than without (measured at 2048)
        for module in transformer.modules():  # the attention reads its module's p: the saved config keeps its own
            if isinstance(module, nn.Dropout):
                module.p = e.dropout
    positions = {id(p) for n, p in transformer.named_parameters() if n in position_parameter_names(transformer)}
    select_trainable(transformer, t.trainable, t.train_norms)
    if t.gradient_checkpointing:  # on the transformer itself: the Trainer's own route warns three times (5.24)
        enable_checkpointing(transformer)
    pairs = document_pairs(
        recipe.data.train,
        model.tokenizer,
        e.document_lengths,
        e.pairs,
        e.anchor_words,
        seed,
        recipe.data.text_column,
        e.hard_negatives,
    )
    if first:
        start_record(run_dir, recipe, raw, fresh=True)
        log.start()
    log.model, log.seed = model, seed if e.soup > 1 else None
    trainer = SentenceTransformerTrainer(
        model=model,
        args=training_arguments(recipe, run_dir, seed),
        **datasets_and_losses(model, e, pairs, taught, chunked, old_limit, context_pairs(model, e, seed, t.batch_size)),
        optimizers=optimizer_and_schedule(model, positions, t),
        callbacks=[log],
    )
    trainer.remove_callback(ProgressCallback)
    trainer.add_callback(LossBar())
    with interruptible_backward(model):
        trainer.train()
    return model


@contextlib.contextmanager
def interruptible_backward(model: nn.Module) -> Iterator[None]:
    """Ctrl-C within a module's backward: Python handles a signal only between bytecodes, and a step's backward is
    one call into torch (8 documents of 2048 tokens: several seconds on 2 cores, a minute on a busy machine), so
    a KeyboardInterrupt would wait for its end. A no-op gradient hook on every module's output runs Python code at
    each module of the backward, where the interrupt is raised. The gradients are the same."""
    handles = [module.register_forward_hook(_hook_outputs) for module in model.modules()]
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _hook_outputs(module: nn.Module, args, output) -> None:
    for tensor in (
        output if isinstance(output, (tuple, list)) else output.values() if isinstance(output, dict) else [output]
    ):
        if isinstance(tensor, torch.Tensor) and tensor.requires_grad and tensor.grad_fn is not None:
            tensor.register_hook(_no_change)


def _no_change(grad: torch.Tensor) -> None:
    """Returns None: the gradient goes on as it is."""


def context_pairs(model, e, seed: int, batch_size: int):
    """The ``embedding.context_pairs`` rows (documents with a question about a subject named elsewhere in them)."""
    check_context_pairs(model, e.context_pairs)
    lengths = e.context_document_lengths()
    return context_rows(
        model.tokenizer,
        lengths,
        e.context_pairs,
        seed,
        e.context_chunk_tokens,
        batch_size,
        e.context_source,
        haystacks=tuple(e.context_haystacks) if e.context_haystacks else None,
    )


def datasets_and_losses(model, e, pairs, taught, chunked, old_limit: int, contexts=None) -> dict:
    """The trainer's ``train_dataset`` and ``loss``: the pairs alone, or a dataset and a loss per teacher beside
    them (sentence-transformers draws each step's batch from one of them, in proportion to their sizes)."""
    sets, losses = {"pairs": pairs}, {"pairs": ranking_loss(model, e)}
    if taught is not None:
        sets["teacher"], losses["teacher"] = taught, TeacherLoss(model)
    if chunked is not None:
        sets["chunks"], losses["chunks"] = chunked, LateChunkLoss(model, old_limit)
    if contexts is not None:
        sets["context"], losses["context"] = contexts, ContextChunkLoss(model, e.scale, e.context_copy_margin)
    if len(sets) == 1:
        return {"train_dataset": pairs, "loss": losses["pairs"]}
    return {"train_dataset": datasets.DatasetDict(sets), "loss": losses}


def mean_weights(states) -> dict[str, torch.Tensor]:
    """The mean of state dicts with the same names (any iterable: each is added as it comes, summed in float64),
    in the first one's dtypes: a uniform model soup of runs from the same start."""
    total: dict[str, torch.Tensor] = {}
    dtypes: dict[str, torch.dtype] = {}
    count = 0
    for state in states:
        if total and state.keys() != total.keys():
            raise ValueError("The runs' weights differ in their names: not runs of one recipe.")
        for name, value in state.items():
            dtypes.setdefault(name, value.dtype)
            total[name] = total[name] + value.detach().double() if name in total else value.detach().double()
        count += 1
    return {name: (value / count).to(dtypes[name]) for name, value in total.items()}


def check_document_lengths(model, lengths: list[int]) -> None:
    """Every document length within what the model reads (with ``posswap: null`` it is the model's own limit):
    a longer document would be cut, its passage perhaps with it."""
    limit = transformer_module(model).max_seq_length
    if max(lengths) > limit:
        raise ValueError(
            f"embedding.document_lengths entry {max(lengths)} is longer than the model reads ({limit} tokens); "
            "shorten it or extend the model with a posswap: block."
        )


def load_sentence_model(recipe: Recipe):
    """The recipe's model as a ``SentenceTransformer`` on the CPU, as found (:func:`patch_as_the_recipe_says`
    patches it, after the teacher read it); a folder that is a plain transformers encoder is wrapped with mean
    pooling (as ``SentenceTransformer(name)`` does)."""
    from sentence_transformers import SentenceTransformer

    name = resolve_model_id(recipe.model)
    model = load_sentence_transformer(name, device="cpu")
    return model if model is not None else SentenceTransformer(name, device="cpu")


def patch_as_the_recipe_says(model, recipe: Recipe) -> None:
    if recipe.posswap is not None and patched_config(transformer_module(model).auto_model) != recipe.posswap:
        patch(model, recipe.posswap)


def ranking_loss(model, e) -> nn.Module:
    from sentence_transformers.sentence_transformer import losses

    if e.loss == "mnrl":
        return losses.MultipleNegativesRankingLoss(model, scale=e.scale)
    return losses.CachedMultipleNegativesRankingLoss(model, scale=e.scale, mini_batch_size=e.mini_batch_size)


def optimizer_and_schedule(model: nn.Module, positions: set[int], t):
    """The MLM/CLM loop's AdamW groups (``positions``: ids of the position parameters, at ``train.position_lr``
    when given) with warmup and cosine decay over ``max_steps``."""
    optimizer = torch.optim.AdamW(parameter_groups(model, positions, t), lr=t.lr)
    return optimizer, get_cosine_schedule_with_warmup(optimizer, t.warmup_steps, t.max_steps)


def training_arguments(recipe: Recipe, run_dir: Path, seed: int):
    from sentence_transformers import SentenceTransformerTrainingArguments

    from .batches import context_batch_sampler

    t = recipe.train
    return SentenceTransformerTrainingArguments(
        output_dir=str(run_dir / "trainer"),
        max_steps=t.max_steps,
        per_device_train_batch_size=t.batch_size,
        gradient_accumulation_steps=t.grad_accum,
        max_grad_norm=MAX_GRAD_NORM,
        logging_steps=t.log_every,
        save_strategy="no",  # a Trainer checkpoint pickles the optimizer; posswap writes safetensors only
        report_to=[],
        seed=seed,
        data_seed=seed,
        use_cpu=not torch.cuda.is_available(),
        dataloader_drop_last=True,
        batch_sampler=context_batch_sampler,
        disable_tqdm=False,
    )


class JsonLog(TrainerCallback):
    """``log.jsonl`` lines (step, loss, lr; and the run's seed in a soup) as the MLM/CLM loop writes them;
    ``callbacks`` get ``(step, loss, model)`` at each logged step."""

    def __init__(self, path: Path, callbacks) -> None:
        self.path, self.callbacks = path, list(callbacks)
        self.model: nn.Module | None = None
        self.seed: int | None = None

    def start(self) -> None:
        self.path.write_text("")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not logs or "loss" not in logs:
            return
        line = {"step": state.global_step, "loss": logs["loss"], "lr": logs.get("learning_rate")}
        if self.seed is not None:
            line["seed"] = self.seed
        with open(self.path, "a") as f:
            f.write(json.dumps(line) + "\n")
        for callback in self.callbacks:
            callback(state.global_step, logs["loss"], self.model)


class LossBar(ProgressCallback):
    """The trainer's progress bar with the loss on it, as the MLM/CLM loop shows it, instead of a printed dict per
    logged step (and one of run totals at the end)."""

    def on_train_begin(self, args, state, control, **kwargs):
        super().on_train_begin(args, state, control, **kwargs)
        if self.training_bar is not None:
            self.training_bar.set_description("train")

    def on_log(self, args, state, control, logs=None, **kwargs):
        if self.training_bar is not None and logs and "loss" in logs:
            self.training_bar.set_postfix(loss=f"{float(logs['loss']):.3f}")
