"""What each ``posswap`` command runs, thin: check what can be checked, call the library, print one line. The
parsers (``cli/parsers.py``) set ``run`` to one of these; torch and transformers load here, when a command runs."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from .facts import METHOD_OPTIONS, PASSKEY_DEPTHS

DEFAULT_LENGTHS = (256, 512, 1024)


def _chosen_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {name for options in METHOD_OPTIONS.values() for name in options}
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def patch_command(args: argparse.Namespace) -> None:
    from ..config import config_from_dict
    from ..files import check_folder_target
    from ..loading import load_model_and_tokenizer, save_model_and_tokenizer
    from ..patching import patch
    from .checks import check_no_shrink

    # Everything that can be checked fails before any download or write.
    config = config_from_dict({"method": args.method, **_chosen_options(args)})
    source = _model_source(args.model)
    check_folder_target(args.out, args.overwrite, source)
    own = check_no_shrink(source, config.max_length, args.allow_shrink)
    from ..loading import patch_folder

    # Both lines say the length as the user gives it (--max-length), not max_position_embeddings: RoBERTa's counts
    # two padding rows more.
    model = patch_folder(
        source, config, args.out, args.overwrite, args.allow_shrink
    )  # None: not a sentence-transformers model
    if model is not None:
        print(
            f"Patched {args.model} ({type(model).__name__}) with {config.method}: max_length {own} -> "
            f"{config.max_length}, max_seq_length {model.max_seq_length}. Saved to {args.out}"
        )
        return
    model, tokenizer = load_model_and_tokenizer(source)
    patch(
        model, config, tokenizer=tokenizer, allow_shrink=args.allow_shrink
    )  # checks the memory it needs before allocating
    save_model_and_tokenizer(model, tokenizer, args.out, overwrite=args.overwrite, source=source)
    print(
        f"Patched {args.model} ({type(model).__name__}) with {config.method}: "
        f"max_length {own} -> {config.max_length}. Saved to {args.out}"
    )


def _model_source(name: str) -> str:
    """What ``name`` loads from: an embedded model's folder, a folder here, or a Hub id the Hub (or its cache) has;
    anything else is one line saying where it was looked for."""
    from ..loading import resolve_model_id
    from .model_sources import check_model_found

    source = resolve_model_id(name)
    check_model_found(source)
    return source


def demo_command(args: argparse.Namespace) -> None:
    from ..demo import run_demo

    run_demo(
        steps=args.steps,
        documents=args.documents,
        task=args.task,
        out=args.out,
        overwrite=args.overwrite,
        haystack=args.haystack,
        context_documents=args.context_documents,
    )


def eval_command(args: argparse.Namespace) -> None:
    from ..evaluation import evaluate
    from ..evaluation.harness import check_settings
    from ..files import check_output_dir

    if args.task in ("context-retrieval", "natural-context-retrieval"):
        from .retrieval import run_context_command

        return run_context_command(args)
    if args.chunk_tokens is not None:  # read by the context task only: never accepted and ignored
        raise ValueError(
            "--chunk-tokens applies to --task context-retrieval (or natural-context-retrieval) only; remove it."
        )
    if args.task != "text":  # long-document retrieval for sentence-transformers models
        from .retrieval import run_retrieval_command

        return run_retrieval_command(args)  # checks the models after its flags, as below
    check_output_dir(args.out)  # a file there fails now, not after the scoring
    settings = dict(stride=args.stride, beyond=args.beyond, max_tokens=args.max_tokens, seed=args.seed)
    settings.update(passkey_trials=args.passkey_trials, passkey_depths=tuple(args.passkey_depths or PASSKEY_DEPTHS))
    lengths = args.lengths or list(DEFAULT_LENGTHS)
    check_settings(lengths, **settings)  # the flags first, then the models (evaluate checks the flags again)
    for model in args.models:
        _model_source(model)
    results = evaluate(
        _short_names(args.models), args.tokenizer, lengths, args.data, out=args.out, device=args.device, **settings
    )
    print(results.table())
    print(f"Wrote {Path(args.out) / 'results.json'} and the plots.")


def push_command(args: argparse.Namespace) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    from ..hub import push_to_hub

    try:
        url = push_to_hub(args.folder, args.repo_id, results=args.results, plots=args.plots or (), private=args.private)
    except HfHubHTTPError as error:  # the Hub's refusal (bad token, no write access) as a one-line CLI error
        raise OSError(f"the Hub refused the upload: {error}") from None
    print(f"Pushed {args.folder} to {url}")


def export_command(args: argparse.Namespace) -> None:
    source = _model_source(args.folder)
    if args.format == "onnx" or args.int8:
        return export_onnx_command(args, source)
    from ..export import TOLERANCE, export

    result = export(source, args.out, overwrite=args.overwrite)  # checks --out and MODEL's files before any work
    print(
        f"Exported {args.folder} as {result.architecture} to {result.path} "
        f"(max logit difference {result.max_difference:.1e}, limit {TOLERANCE:.0e}); "
        f"upload it with: posswap push {result.path} REPO_ID"
    )


def export_onnx_command(args: argparse.Namespace, source: str) -> None:
    if args.format != "onnx":
        raise ValueError("--int8 quantises an ONNX graph: add --format onnx.")
    from ..onnx.export import export_onnx  # imports no onnx: export_onnx names the extra when it is missing

    result = export_onnx(source, args.out, int8=args.int8, overwrite=args.overwrite)
    print(
        f"Exported {args.folder} as ONNX ({result.layout} layout: {', '.join(result.graphs)}) to {result.path} "
        f"(max difference from the torch model {result.max_difference:.1e})"
        + (f"; int8 cosine to float by length {result.int8_cosine}" if result.int8_cosine else "")
    )


def _short_names(models: list[str]) -> dict[str, str]:
    """Table rows named by a folder's last part (``out/gpt2-rope-4k`` -> ``gpt2-rope-4k``) where unambiguous."""
    short = [Path(m).name if Path(m).exists() else m for m in models]
    return dict(zip(short if len(set(short)) == len(short) else models, models))


def train_command(args: argparse.Namespace) -> None:
    if args.list:
        return list_recipes(args)
    if args.recipe is None:
        raise ValueError("give a RECIPE (a YAML file, or the name of a shipped recipe), or --list to see those.")
    if args.force and not args.resume:
        raise ValueError("--force only applies with --resume (it resumes checkpoints made with another recipe).")
    import warnings

    from ..shipped_recipes import LocalRecipePassedOver, recipe_file

    recipe_file(args.recipe)  # an unknown name is refused here, before training's imports load torch (seconds)
    from ..training import load_recipe, train

    with warnings.catch_warnings():  # the run's first line says which file it read, and which it did not
        warnings.simplefilter("ignore", LocalRecipePassedOver)
        recipe, raw = load_recipe(args.recipe, args.set or [])  # every key checked before anything is loaded or written
    final = train(recipe, raw, resume=args.resume, overwrite=args.overwrite, force=args.force)
    print(f"Trained model saved to {final}")


def list_recipes(args: argparse.Namespace) -> None:
    from ..shipped_recipes import purpose, recipes_folder, shipped_recipes

    given = [flag for flag, value in (("RECIPE", args.recipe), ("--set", args.set)) if value]
    given += [f"--{flag}" for flag in ("resume", "overwrite", "force") if getattr(args, flag)]
    if given:
        raise ValueError(f"--list lists the shipped recipes and runs none: drop {', '.join(given)}.")
    recipes = shipped_recipes()
    width = max(map(len, recipes), default=0)
    for name, path in recipes.items():
        print(f"{name:<{width}}  {purpose(path)}")
    print(f"Run one with: posswap train NAME (files in {recipes_folder()}; accelerate configs in accelerate/ there).")
