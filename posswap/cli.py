"""The command line: ``posswap patch|demo|eval|train|study|push|export``.

- ``patch MODEL --method M --out DIR``: patch a checkpoint (or a sentence-transformers folder) and save it;
- ``demo``: patch the embedded MiniLM and show it reads longer inputs;
- ``eval MODEL ...``: score models at each context length (results.json and plots);
- ``train RECIPE``: continued pretraining at the new length from a YAML recipe or a shipped one (``--list``);
- ``study``: the extension study (the copying presets, or the text study on GPT-2 and MiniLM: ``cli_study``);
- ``push FOLDER REPO_ID``: upload a saved model with a posswap model card;
- ``export MODEL --out DIR``: write a RoPE model as a native transformers model where one is exact.

Method options come from the method config dataclasses, so a new method gets its flags by being registered. The
parsers' conventions (one-line errors, no abbreviated flags, list flags) are ``cli_args``'s; before any work, a model
name found nowhere is refused by ``model_sources``, a shrinking ``--max-length`` by ``cli_checks``."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path
from typing import Any

import yaml

from .cli_args import Parser, Renamed, list_flag, renamed, yaml_value
from .cli_study import add_study
from .evaluation.passkey import DEPTHS
from .extras import MissingExtra
from .portable.posswap_block import RENAMED_KEYS
from .registry import METHODS

DEFAULT_LENGTHS = (256, 512, 1024)


def _chosen_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for spec in METHODS.values() for f in dataclasses.fields(spec.config_class)}
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _cmd_patch(args: argparse.Namespace) -> None:
    from .cli_checks import check_no_shrink
    from .config import config_from_dict
    from .files import check_folder_target
    from .loading import load_model_and_tokenizer, save_model_and_tokenizer
    from .patching import patch

    # Everything that can be checked fails before any download or write.
    config = config_from_dict({"method": args.method, **_chosen_options(args)})
    source = _model_source(args.model)
    check_folder_target(args.out, args.overwrite, source)
    own = check_no_shrink(source, config.max_length, args.allow_shrink)
    from .loading import patch_folder

    # Both lines say the length as the user gives it (--max-length), not max_position_embeddings: RoBERTa's counts
    # two padding rows more.
    model = patch_folder(source, config, args.out, args.overwrite)  # None: not a sentence-transformers model
    if model is not None:
        print(
            f"Patched {args.model} ({type(model).__name__}) with {config.method}: max_length {own} -> "
            f"{config.max_length}, max_seq_length {model.max_seq_length}. Saved to {args.out}"
        )
        return
    model, tokenizer = load_model_and_tokenizer(source)
    patch(model, config, tokenizer=tokenizer)  # checks the memory it needs before allocating
    save_model_and_tokenizer(model, tokenizer, args.out, overwrite=args.overwrite, source=source)
    print(
        f"Patched {args.model} ({type(model).__name__}) with {config.method}: "
        f"max_length {own} -> {config.max_length}. Saved to {args.out}"
    )


def _model_source(name: str) -> str:
    """What ``name`` loads from: an embedded model's folder, a folder here, or a Hub id the Hub (or its cache) has;
    anything else is one line saying where it was looked for."""
    from .loading import resolve_model_id
    from .model_sources import check_model_found

    source = resolve_model_id(name)
    check_model_found(source)
    return source


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(
        steps=args.steps,
        documents=args.documents,
        task=args.task,
        output_dir=args.out,
        overwrite=args.overwrite,
        haystack=args.haystack,
        context_documents=args.context_documents,
    )


def _cmd_eval(args: argparse.Namespace) -> None:
    from .evaluation import evaluate
    from .evaluation.harness import check_settings
    from .files import check_output_dir

    if args.task == "context-retrieval":
        from .evaluation.context_retrieval import run_context_command

        return run_context_command(args)
    if args.chunk_tokens is not None:  # read by the context task only: never accepted and ignored
        raise ValueError("--chunk-tokens applies to --task context-retrieval only; remove it.")
    if args.task != "text":  # long-document retrieval for sentence-transformers models
        from .evaluation.retrieval import run_retrieval_command

        return run_retrieval_command(args)  # checks the models after its flags, as below
    check_output_dir(args.out)  # a file there fails now, not after the scoring
    settings = dict(stride=args.stride, beyond=args.beyond, max_tokens=args.max_tokens, seed=args.seed)
    settings.update(passkey_trials=args.passkey_trials, passkey_depths=tuple(args.passkey_depths or DEPTHS))
    lengths = args.lengths or list(DEFAULT_LENGTHS)
    check_settings(lengths, **settings)  # the flags first, then the models (evaluate checks the flags again)
    for model in args.models:
        _model_source(model)
    results = evaluate(
        _short_names(args.models), args.tokenizer, lengths, args.data, out=args.out, device=args.device, **settings
    )
    print(results.table())
    print(f"Wrote {Path(args.out) / 'results.json'} and the plots.")


def _cmd_push(args: argparse.Namespace) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    from .hub import push_to_hub

    try:
        url = push_to_hub(args.folder, args.repo_id, results=args.results, plots=args.plots or (), private=args.private)
    except HfHubHTTPError as error:  # the Hub's refusal (bad token, no write access) as a one-line CLI error
        raise OSError(f"the Hub refused the upload: {error}") from None
    print(f"Pushed {args.folder} to {url}")


def _cmd_export(args: argparse.Namespace) -> None:
    from .export import TOLERANCE, export

    _model_source(args.folder)
    if args.format == "onnx" or args.int8:
        return _cmd_export_onnx(args)
    result = export(args.folder, args.out)
    print(
        f"Exported {args.folder} as {result.architecture} to {result.path} "
        f"(max logit difference {result.max_difference:.1e}, limit {TOLERANCE:.0e}); "
        f"upload it with: posswap push {result.path} REPO_ID"
    )


def _cmd_export_onnx(args: argparse.Namespace) -> None:
    from .onnx_export import export_onnx

    if args.format != "onnx":
        raise ValueError("--int8 quantises an ONNX graph: add --format onnx.")
    result = export_onnx(args.folder, args.out, int8=args.int8)
    print(
        f"Exported {args.folder} as ONNX ({result.layout} layout: {', '.join(result.graphs)}) to {result.path} "
        f"(max difference from the torch model {result.max_difference:.1e})"
        + (f"; int8 cosine to float by length {result.int8_cosine}" if result.int8_cosine else "")
    )


def _short_names(models: list[str]) -> dict[str, str]:
    """Table rows named by a folder's last part (``out/gpt2-rope-4k`` -> ``gpt2-rope-4k``) where unambiguous."""
    short = [Path(m).name if Path(m).exists() else m for m in models]
    return dict(zip(short if len(set(short)) == len(short) else models, models))


def _cmd_train(args: argparse.Namespace) -> None:
    if args.list:
        return _list_recipes(args)
    if args.recipe is None:
        raise ValueError("give a RECIPE (a YAML file, or the name of a shipped recipe), or --list to see those.")
    from .training import load_recipe, train

    if args.force and not args.resume:
        raise ValueError("--force only applies with --resume (it resumes checkpoints made with another recipe).")
    import warnings

    from .shipped_recipes import LocalRecipePassedOver

    with warnings.catch_warnings():  # the run's first line says which file it read, and which it did not
        warnings.simplefilter("ignore", LocalRecipePassedOver)
        recipe, raw = load_recipe(args.recipe, args.set or [])  # every key checked before anything is loaded or written
    final = train(recipe, raw, resume=args.resume, overwrite=args.overwrite, force=args.force)
    print(f"Trained model saved to {final}")


def _list_recipes(args: argparse.Namespace) -> None:
    from .shipped_recipes import purpose, recipes_folder, shipped_recipes

    given = [flag for flag, value in (("RECIPE", args.recipe), ("--set", args.set)) if value]
    given += [f"--{flag}" for flag in ("resume", "overwrite", "force") if getattr(args, flag)]
    if given:
        raise ValueError(f"--list lists the shipped recipes and runs none: drop {', '.join(given)}.")
    recipes = shipped_recipes()
    width = max(map(len, recipes), default=0)
    for name, path in recipes.items():
        print(f"{name:<{width}}  {purpose(path)}")
    print(f"Run one with: posswap train NAME (files in {recipes_folder()}; accelerate configs in accelerate/ there).")


def _method_options(parser: argparse.ArgumentParser) -> None:
    """One flag per config field of any method (``--rope-type``, ``--theta``, ...); listed per method in the epilog,
    each with its own method's text."""
    seen: set[str] = set()
    for spec in METHODS.values():
        for f in dataclasses.fields(spec.config_class):
            if f.name not in seen:
                seen.add(f.name)
                shown = f.name == "max_length"  # every method's: in the options list
                help_text = f.metadata.get("help") if shown else argparse.SUPPRESS
                parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=yaml_value, help=help_text)


def _method_help() -> str:
    """Each method's own options with its own help text (the epilog of ``posswap patch --help``)."""
    import textwrap

    lines = ["method options (a method takes only its own; values are YAML: 4096, 0.5, yarn, true, null):"]
    for spec in METHODS.values():
        lines.append(
            f"  --method {spec.name}:" + ("" if len(dataclasses.fields(spec.config_class)) > 1 else " (no options)")
        )
        for f in dataclasses.fields(spec.config_class):
            if f.name != "max_length":
                flag = f"    --{f.name.replace('_', '-')}"
                lines.append(
                    textwrap.fill(
                        f.metadata.get("help", ""), 118, initial_indent=f"{flag:<26}", subsequent_indent=" " * 26
                    )
                )
    return "\n".join(lines)


def _add_patch(commands) -> None:
    p = commands.add_parser(
        "patch",
        help="Patch a checkpoint and save it (with its tokenizer) to a folder.",
        epilog=_method_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("model", metavar="MODEL", help="Hub id or local folder of a BERT-family or GPT-2 checkpoint.")
    p.add_argument("--method", required=True, choices=sorted(METHODS), help="Position method to apply.")
    p.add_argument("--out", required=True, help="New folder to write the patched model and tokenizer to.")
    p.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace --out if it is a model folder (holds config.json) written earlier.",
    )
    p.add_argument(
        "--allow-shrink",
        action="store_true",
        help="Allow a --max-length below the model's own length (positions past it are lost).",
    )
    _method_options(p)
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    for old, new in {old: new for renames in RENAMED_KEYS.values() for old, new in renames.items()}.items():
        renamed(p, flag(old), flag(new))  # the config keys renamed since 0.x: their flags say the new name
    p.set_defaults(run=_cmd_patch)


DEMO_HAYSTACKS = ("persuasion", "filler")  # posswap.demo.HAYSTACKS: `posswap --help` imports no torch
DEMO_CONTEXT_DOCUMENTS = 40  # posswap.demo.CONTEXT_DOCUMENTS
DEMO_STEPS, DEMO_TEACHER_STEPS = 12, 4  # the chunk teacher's share: a third (minilm-embed-2k: 64 documents, 192 pairs)


def _add_demo(commands) -> None:
    d = commands.add_parser(
        "demo",
        help="The real all-MiniLM-L6-v2 patched to read 2048 tokens, trained briefly, and scored on retrieval "
        "against truncating and chunking.",
        description="Patch the real all-MiniLM-L6-v2 (512 positions) to read 2048 tokens with the minilm-embed-2k "
        "recipe's placement, train it briefly with that recipe (one run, shortened), and score passkey (or needle) "
        "retrieval at 256-2048 tokens with the needle in held-out prose: one trained vector per document against "
        "the stock model truncating, the stock model's chunks and the trained model's late chunks; then facts whose "
        "chunk does not name its subject. One table and a verdict computed from it on the screen, the results in "
        "OUT/results/. About 4 minutes on 2 CPU cores; a second run reuses the trained model.",
    )
    d.add_argument(
        "--steps",
        type=int,
        default=DEMO_STEPS,
        help=f"Training steps of 8 pairs (default {DEMO_STEPS}; 0: untrained only). The recipe's chunk teacher adds a "
        f"third as many steps of its own, so the train bar counts {DEMO_STEPS + DEMO_TEACHER_STEPS} at the default.",
    )
    d.add_argument("--documents", type=int, default=30, help="Documents per length (default 30; 100 in the docs).")
    d.add_argument("--task", choices=["passkey", "needle"], default="passkey", help="Retrieval task (default passkey).")
    d.add_argument(
        "--haystack",
        choices=list(DEMO_HAYSTACKS),
        default="persuasion",
        help="The text around the needle: persuasion (default; Persuasion, a novel no recipe trains on: the needle "
        "is one sentence of running prose) or filler (LongEmbed's synthetic filler, 'The grass is green. The sky is "
        "blue. ...' repeated, where any inserted sentence stands out).",
    )
    d.add_argument(
        "--context-documents",
        type=int,
        default=DEMO_CONTEXT_DOCUMENTS,
        help=f"Documents of the short context task (facts whose chunk does not name its subject, at 1024 tokens; "
        f"default {DEMO_CONTEXT_DOCUMENTS}, 0: skip it).",
    )
    d.add_argument("--out", default="out/demo", help="Run folder: train/ (the model) and results/ (default out/demo).")
    d.add_argument("--overwrite", action="store_true", help="Train again over the model an earlier demo left.")
    d.add_argument(  # the demo's length is its recipe's now (the README's numbers are at that length)
        "--max-length",
        action=Renamed,
        message="posswap demo no longer takes --max-length: it reads the minilm-embed-2k recipe's 2048 tokens; for "
        "another length run posswap train minilm-embed-2k --set posswap.max_length=N.",
    )
    d.set_defaults(run=_cmd_demo)


def _add_eval(commands) -> None:
    e = commands.add_parser("eval", help="Score models at each context length; write results.json and PNG plots.")
    e.add_argument("models", nargs="+", metavar="MODEL", help="Hub ids or local folders (patched or stock).")
    list_flag(
        e, "--lengths", int, metavar="LENGTH", help=f"Context lengths (default {' '.join(map(str, DEFAULT_LENGTHS))})."
    )
    e.add_argument(
        "--data",
        default="posswap:austen-heldout",
        help="posswap:<split>, a .txt/.jsonl/.parquet file or a datasets name.",
    )
    e.add_argument("--out", default="report", help="Folder for results.json and the plots (default report/).")
    e.add_argument("--tokenizer", default=None, help="Tokenizer (default: the first MODEL's).")
    e.add_argument(
        "--stride",
        type=int,
        default=None,
        help="Sliding-window perplexity with this stride (default: non-overlapping windows).",
    )
    e.add_argument(
        "--beyond",
        choices=("truncate", "sliding"),
        default="truncate",
        help="How a model reads lengths past its own limit.",
    )
    e.add_argument("--max-tokens", type=int, default=8192, help="Tokens scored per model and length (default 8192).")
    e.add_argument(
        "--passkey-trials", type=int, default=3, help="Passkey keys per length and depth, causal LMs only (0: skip)."
    )
    list_flag(
        e,
        "--passkey-depths",
        float,
        metavar="DEPTH",
        help=f"Depths of the key, 0 to 1 (default {' '.join(map(str, DEPTHS))}).",
    )
    e.add_argument("--seed", type=int, default=0, help="Seed of the masks and keys (the same for every model).")
    e.add_argument(
        "--device", default=None, help="Where the models run: cpu, cuda, cuda:N (default: cuda if available, else cpu)."
    )
    _add_retrieval_flags(e)
    e.set_defaults(run=_cmd_eval)


def _add_retrieval_flags(e) -> None:
    e.add_argument(
        "--task",
        choices=("text", "passkey-retrieval", "needle-retrieval", "context-retrieval"),
        default="text",
        help="text (default): the scores above. passkey-retrieval, needle-retrieval: LongEmbed's long-document "
        "retrieval for sentence-transformers models (retrieval.json, retrieval.png; default lengths 256 512 1024 2048). "
        "context-retrieval: chunks whose facts are about a subject named elsewhere in their document (context.json; "
        "default lengths 512 1024 2048 4096).",
    )
    e.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="context-retrieval: the most tokens a chunk holds, special tokens counted (default 128).",
    )
    e.add_argument("--documents", type=int, default=100, help="Retrieval: documents per length (default 100).")
    e.add_argument("--batch-size", type=int, default=8, help="Retrieval: texts encoded at once (default 8).")
    list_flag(
        e,
        "--baselines",
        metavar="BASELINE",
        help="Retrieval: chunk-mean, chunk-max (the first MODEL over chunks of its own limit), late-chunk-max (each "
        "longer MODEL, late chunking at that size): extra columns.",
    )
    e.add_argument(
        "--haystack",
        default=None,
        help="Retrieval: the text the needle hides in: filler, or an embedded document such as persuasion or kjv "
        "(default: filler for passkey, persuasion for needle).",
    )


def _add_train(commands) -> None:
    t = commands.add_parser(
        "train", help="Continued pretraining at the new length from a recipe (a YAML file, or a shipped one by name)."
    )
    t.add_argument("recipe", nargs="?", default=None, help="Recipe YAML file, or a shipped recipe's name (see --list).")
    t.add_argument("--list", action="store_true", help="List the shipped recipes, each with its purpose.")
    t.add_argument(
        "--set",
        nargs="+",
        action="extend",
        default=None,
        metavar="KEY=VALUE",
        help="Override recipe values, e.g. --set train.lr=1e-4 train.max_steps=200 (repeatable).",
    )
    t.add_argument("--resume", action="store_true", help="Continue from the latest checkpoint in train.output_dir.")
    t.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace the model folder an earlier run left in train.output_dir/model.",
    )
    t.add_argument(
        "--force",
        action="store_true",
        help="With --resume: continue even if the recipe differs from the one the checkpoints were made with.",
    )
    t.set_defaults(run=_cmd_train)


def _add_push(commands) -> None:
    h = commands.add_parser(
        "push", help="Upload a saved model (patched, or a native export) to the Hub with a posswap model card."
    )
    h.add_argument(
        "folder", metavar="FOLDER", help="Folder that save_pretrained, posswap patch or posswap export wrote."
    )
    h.add_argument("repo_id", metavar="REPO_ID", help="Hub repo, e.g. me/gpt2-rope-4k (created if missing).")
    h.add_argument("--private", action="store_true", help="Create the repo as private.")
    h.add_argument("--results", default=None, help="results.json from posswap eval: its table goes into the card.")
    list_flag(h, "--plots", metavar="PNG", help="Images to upload under plots/ and show in the card.")
    h.set_defaults(run=_cmd_push)


def _add_export(commands) -> None:
    x = commands.add_parser(
        "export", help="Write a RoPE model as a native transformers model where one is exact (GPT-NeoX, RoFormer)."
    )
    x.add_argument("folder", metavar="MODEL", help="Folder (or Hub id) of a posswap-patched model.")
    x.add_argument("--out", required=True, help="New (or empty) folder for the native model and the tokenizer.")
    x.add_argument(
        "--format",
        choices=("native", "onnx"),
        default="native",
        help="native: a transformers architecture (RoPE); onnx: an ONNX graph for onnxruntime (posswap.onnx_export).",
    )
    x.add_argument("--int8", action="store_true", help="With --format onnx: also an int8 dynamically quantised graph.")
    x.add_argument(
        "--push",
        action=Renamed,
        message="export no longer pushes; run posswap push OUT REPO_ID (OUT: the --out folder).",
    )
    x.set_defaults(run=_cmd_export)


def build_parser() -> argparse.ArgumentParser:
    """The commands, one ``_add_<command>`` each; ``--debug`` is taken before or after the command."""
    from . import methods  # noqa: F401  (fills METHODS)

    parser = Parser(prog="posswap", description="Swap the position handling of pretrained transformers.")
    parser.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_patch, _add_demo, _add_eval, _add_train, add_study, _add_push, _add_export):
        add(commands)
    for sub in commands.choices.values():  # SUPPRESS keeps a --debug given before the command
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="Show the full traceback of an error."
        )
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as done:  # a bad flag: argparse printed its one line; --help (0) still exits
        if not done.code:
            raise
        return done.code
    try:
        args.run(args)
    except KeyboardInterrupt:
        print(f"posswap {args.command}: interrupted.", file=sys.stderr)
        return 130
    except Exception as error:
        if args.debug:
            raise
        return _report(args.command, error)
    return 0


MAX_MESSAGE = 400


def _report(command: str, error: Exception) -> int:
    """One line on stderr: exit 2 for what the user can fix (inputs, files, memory), 1 for anything else."""
    message = " ".join(str(error).split()) or type(error).__name__
    if len(message) > MAX_MESSAGE:  # one line, whatever value a message quotes
        message = message[: MAX_MESSAGE - 100] + " ... " + message[-95:]  # the advice is often at the end
    if _disk_full(error):  # safetensors and torch report it as their own errors
        print(
            f"posswap {command}: error: the disk is full (No space left on device); free some space and run again. ({message})",
            file=sys.stderr,
        )
        return 2
    if isinstance(error, _USER_ERRORS) or _out_of_memory(error):
        print(f"posswap {command}: error: {message}", file=sys.stderr)
        return 2
    print(
        f"posswap {command}: unexpected {type(error).__name__}: {message} (run with --debug for the traceback)",
        file=sys.stderr,
    )
    return 1


# A user's mistake: a bad value (ValueError, TypeError), a file that is missing or unreadable (OSError),
# a file that is not YAML, no memory for what was asked, an extra to install.
# An optional dependency that is not installed names its extra (MissingExtra).
_USER_ERRORS = (ValueError, TypeError, OSError, yaml.YAMLError, MemoryError, MissingExtra)


def _disk_full(error: BaseException) -> bool:
    import errno

    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error) or "StorageFull" in str(error) or "os error 28" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def _out_of_memory(error: Exception) -> bool:
    import torch

    return isinstance(error, torch.OutOfMemoryError) or (isinstance(error, RuntimeError) and "allocate" in str(error))


if __name__ == "__main__":
    sys.exit(main())
