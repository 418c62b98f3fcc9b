"""The command line: ``posswap patch|demo|eval|train|study|push|export``.

- ``patch MODEL --method M --out DIR``: patch a checkpoint (or a sentence-transformers folder) and save it;
- ``demo``: patch the embedded MiniLM and show it reads longer inputs;
- ``eval MODEL ...``: score models at each context length (results.json and plots);
- ``train RECIPE``: continued pretraining at the new length from a YAML recipe;
- ``study``: the extension study (the copying presets, or the text study on GPT-2 and MiniLM);
- ``push FOLDER REPO_ID``: upload a saved model with a posswap model card;
- ``export MODEL --out DIR``: write a RoPE model as a native transformers model where one is exact.

Method options come from the method config dataclasses, so a new method gets its flags by being registered. List
flags take values separated by spaces and may be repeated (``--lengths 256 512 --lengths 1024``)."""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from .config import check_number, load_yaml
from .evaluation.passkey import DEPTHS
from .portable.posswap_block import RENAMED_IN, RENAMED_KEYS
from .registry import METHODS

DEFAULT_LENGTHS = (256, 512, 1024)


def _scalar(text: str) -> Any:
    """``4096`` -> 4096, ``0.5`` -> 0.5, ``1e6`` -> 1000000.0, ``yarn`` -> "yarn", ``null`` -> None: the config
    validates the type."""
    try:
        return load_yaml(text)
    except yaml.YAMLError as error:  # argparse reports ArgumentTypeError as one usage line
        raise argparse.ArgumentTypeError(
            f"not valid YAML: {getattr(error, 'problem', None) or type(error).__name__}"
        ) from None


def _chosen_options(args: argparse.Namespace) -> dict[str, Any]:
    names = {f.name for spec in METHODS.values() for f in dataclasses.fields(spec.config_class)}
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}


def _cmd_patch(args: argparse.Namespace) -> None:
    from .config import config_from_dict
    from .files import check_folder_target
    from .loading import load_model_and_tokenizer, resolve_model_id, save_model_and_tokenizer
    from .patching import patch

    # Everything that can be checked fails before any download or write.
    config = config_from_dict({"method": args.method, **_chosen_options(args)})
    source = resolve_model_id(args.model)
    check_folder_target(args.out, args.overwrite, source)
    from .loading import patch_folder

    done = patch_folder(source, config, args.out, args.overwrite)  # None: not a sentence-transformers model
    if done is not None:
        model, before, after = done
        print(
            f"Patched {args.model} ({type(model).__name__}) with {config.method}: max_position_embeddings {before} -> "
            f"{after}, max_seq_length {model.max_seq_length}. Saved to {args.out}"
        )
        return
    model, tokenizer = load_model_and_tokenizer(source)
    before = model.config.max_position_embeddings
    patch(model, config, tokenizer=tokenizer)  # checks the memory it needs before allocating
    save_model_and_tokenizer(model, tokenizer, args.out, overwrite=args.overwrite, source=source)
    print(
        f"Patched {args.model} ({type(model).__name__}) with {config.method}: "
        f"max_position_embeddings {before} -> {model.config.max_position_embeddings}. Saved to {args.out}"
    )


def _cmd_demo(args: argparse.Namespace) -> None:
    from .demo import run_demo

    run_demo(max_length=args.max_length)


def _cmd_eval(args: argparse.Namespace) -> None:
    from .evaluation import evaluate
    from .files import check_output_dir

    if args.task != "text":  # long-document retrieval for sentence-transformers models
        from .evaluation.retrieval import run_retrieval_command

        return run_retrieval_command(args)
    check_output_dir(args.out)  # a file there fails now, not after the scoring
    depths = args.passkey_depths or DEPTHS
    results = evaluate(
        _short_names(args.models),
        args.tokenizer,
        args.lengths or list(DEFAULT_LENGTHS),
        args.data,
        stride=args.stride,
        beyond=args.beyond,
        max_tokens=args.max_tokens,
        passkey_trials=args.passkey_trials,
        passkey_depths=tuple(depths),
        seed=args.seed,
        out=args.out,
        device=args.device,
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

    result = export(args.folder, args.out)
    print(
        f"Exported {args.folder} as {result.architecture} to {result.path} "
        f"(max logit difference {result.max_difference:.1e}, limit {TOLERANCE:.0e}); "
        f"upload it with: posswap push {result.path} REPO_ID"
    )


def _short_names(models: list[str]) -> dict[str, str]:
    """Table rows named by a folder's last part (``out/gpt2-rope-4k`` -> ``gpt2-rope-4k``) where unambiguous."""
    short = [Path(m).name if Path(m).exists() else m for m in models]
    return dict(zip(short if len(set(short)) == len(short) else models, models))


def _cmd_train(args: argparse.Namespace) -> None:
    from .training import load_recipe, train

    if args.force and not args.resume:
        raise ValueError("--force only applies with --resume (it resumes checkpoints made with another recipe).")
    recipe, raw = load_recipe(args.recipe, args.set or [])  # every key checked before anything is loaded or written
    final = train(recipe, raw, resume=args.resume, overwrite=args.overwrite, force=args.force)
    print(f"Trained model saved to {final}")


def _cmd_study(args: argparse.Namespace) -> None:
    import shlex

    from .evaluation.stream import resolve_device
    from .study import Study, select
    from .study.copying import COPYING_PRESETS

    if args.docs is not None:
        return _write_docs_pages(args)
    if args.preset in COPYING_PRESETS:
        return _cmd_copying_study(args)
    _refuse_other_family(args, COPYING_ONLY, "the copying study (--preset mini, copying or copying-rope)")
    specs = select(
        args.preset,
        args.model,
        args.variants,
        args.steps,
        args.lr,
        not args.no_baseline,
        args.phase or "quick",
        args.repeat_fraction,
    )  # checked first
    device = str(resolve_device(args.device)) if args.device is not None else None
    work = Path(args.work or f"out/study-{args.preset}")
    out = Path(args.out or ("results" if args.preset == "full" else work / "results"))
    command = (
        "posswap " + " ".join(shlex.quote(a) for a in sys.argv[1:]) if sys.argv[1:2] == ["study"] else "posswap study"
    )
    print(Study(specs, work, out, args.reference, device).run(command, report_only=args.report_only))


# The study flags only one family of presets reads (each None unless given): the other refuses them.
TEXT_ONLY = ("--model", "--reference", "--repeat-fraction", "--device", "--phase")
COPYING_ONLY = ("--seeds", "--build-copier", "--jobs")


def _refuse_other_family(args: argparse.Namespace, flags: tuple[str, ...], family: str) -> None:
    for flag in flags:
        if getattr(args, flag[2:].replace("-", "_")) is not None:
            raise ValueError(f"{flag} belongs to {family}; --preset {args.preset} does not read it.")


def _write_docs_pages(args: argparse.Namespace) -> None:
    from .study.docs_report import write_pages

    if not args.report_only:
        raise ValueError("--docs writes the study's pages from saved results: posswap study --report-only --docs DIR.")
    for path in write_pages(Path(args.out or "results"), Path(args.docs)):
        print(f"Wrote {path}")


def _cmd_copying_study(args: argparse.Namespace) -> None:
    import json
    import time

    from .study.copying import COPYING_PRESETS, narrowed, run_copying
    from .study.copying_report import write_report

    _refuse_other_family(args, TEXT_ONLY, "the text study (--preset full or minilm-mini)")
    jobs = 2 if args.jobs is None else args.jobs
    check_number("--jobs", jobs, minimum=1, integer=True)
    spec = narrowed(
        COPYING_PRESETS[args.preset], args.variants, args.steps, args.lr, not args.no_baseline, args.seeds
    )  # checked first
    work = Path(args.work or f"out/study-{args.preset}")
    out = Path(args.out or (f"results/{args.preset}" if args.preset != "mini" else work / "results"))
    if args.report_only:
        found = out / "copying.json"
        if not found.is_file():
            raise ValueError(
                f"No finished copying study in {out} (copying.json missing): run it without --report-only first."
            )
        print(write_report(json.loads(found.read_text()), out))
        return
    started = time.perf_counter()
    results = run_copying(spec, work, out, jobs=jobs, rebuild_copier=bool(args.build_copier))
    print(write_report(results, out))
    print(
        f"Wall time {(time.perf_counter() - started) / 60:.1f} min; table in {out}/summary.md, picture {out}/probe.png."
    )


class _Parser(argparse.ArgumentParser):
    """argparse's parser, with its errors on one line like every other posswap error (the usage is in --help)."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


class _Renamed(argparse.Action):
    """A flag that was in posswap's README and no longer exists: one line naming what replaced it."""

    def __init__(self, option_strings, dest, message: str = "", **kwargs):
        super().__init__(option_strings, dest, nargs="*", default=argparse.SUPPRESS, help=argparse.SUPPRESS)
        self.message = message

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(self.message)


def _renamed(parser: argparse.ArgumentParser, old: str, new: str) -> None:
    parser.add_argument(old, action=_Renamed, message=f"{old} was renamed {new} in posswap {RENAMED_IN}; use {new}.")


def _items(kind: Callable[[str], Any], flag: str) -> Callable[[str], Any]:
    """argparse type of one value of a list flag (``--lengths 256 512``): a comma-separated value is refused,
    showing the space-separated form."""

    def parse(text: str) -> Any:
        parts = [part.strip() for part in text.split(",") if part.strip()]
        if len(parts) > 1:
            raise argparse.ArgumentTypeError(f"values are separated by spaces, not commas: {flag} {' '.join(parts)}")
        return kind(text)

    parse.__name__ = getattr(kind, "__name__", "value")  # argparse's "invalid int value" names the kind
    return parse


def _list_flag(parser, flag: str, kind: Callable = str, **kwargs) -> None:
    """A list flag, posswap's one convention: values separated by spaces, the flag repeatable."""
    parser.add_argument(flag, nargs="+", action="extend", type=_items(kind, flag), default=None, **kwargs)


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
                parser.add_argument("--" + f.name.replace("_", "-"), dest=f.name, type=_scalar, help=help_text)


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
    _method_options(p)
    flag = lambda name: "--" + name.replace("_", "-")  # noqa: E731
    for old, new in {old: new for renames in RENAMED_KEYS.values() for old, new in renames.items()}.items():
        _renamed(p, flag(old), flag(new))  # the config keys renamed since 0.x: their flags say the new name
    p.set_defaults(run=_cmd_patch)


def _add_demo(commands) -> None:
    d = commands.add_parser(
        "demo", help="Patch the embedded real MiniLM (512 positions) and show it reads longer inputs."
    )
    d.add_argument("--max-length", type=int, default=2048, help="New length (default 2048).")
    d.set_defaults(run=_cmd_demo)


def _add_eval(commands) -> None:
    e = commands.add_parser("eval", help="Score models at each context length; write results.json and PNG plots.")
    e.add_argument("models", nargs="+", metavar="MODEL", help="Hub ids or local folders (patched or stock).")
    _list_flag(
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
    _list_flag(
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
        choices=("text", "passkey-retrieval", "needle-retrieval"),
        default="text",
        help="text (default): the scores above. passkey-retrieval, needle-retrieval: LongEmbed's long-document "
        "retrieval for sentence-transformers models (retrieval.json, retrieval.png; default lengths 256 512 1024 2048).",
    )
    e.add_argument("--documents", type=int, default=100, help="Retrieval: documents per length (default 100).")
    e.add_argument("--batch-size", type=int, default=8, help="Retrieval: texts encoded at once (default 8).")
    _list_flag(
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
    t = commands.add_parser("train", help="Continued pretraining at the new length from a YAML recipe (see recipes/).")
    t.add_argument("recipe", help="Recipe YAML file.")
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
    _list_flag(h, "--plots", metavar="PNG", help="Images to upload under plots/ and show in the card.")
    h.set_defaults(run=_cmd_push)


def _add_export(commands) -> None:
    x = commands.add_parser(
        "export", help="Write a RoPE model as a native transformers model where one is exact (GPT-NeoX, RoFormer)."
    )
    x.add_argument("folder", metavar="MODEL", help="Folder (or Hub id) of a posswap-patched model.")
    x.add_argument("--out", required=True, help="New (or empty) folder for the native model and the tokenizer.")
    x.add_argument(
        "--push",
        action=_Renamed,
        message="export no longer pushes; run posswap push OUT REPO_ID (OUT: the --out folder).",
    )
    x.set_defaults(run=_cmd_export)


def build_parser() -> argparse.ArgumentParser:
    """The commands, one ``_add_<command>`` each; ``--debug`` is taken before or after the command."""
    from . import methods  # noqa: F401  (fills METHODS)

    parser = _Parser(prog="posswap", description="Swap the position handling of pretrained transformers.")
    parser.add_argument("--debug", action="store_true", help="Show the full traceback of an error.")
    commands = parser.add_subparsers(dest="command", required=True)
    for add in (_add_patch, _add_demo, _add_eval, _add_train, _add_study, _add_push, _add_export):
        add(commands)
    for sub in commands.choices.values():  # SUPPRESS keeps a --debug given before the command
        sub.add_argument(
            "--debug", action="store_true", default=argparse.SUPPRESS, help="Show the full traceback of an error."
        )
    return parser


def _add_study(commands) -> None:
    from .study.copying import COPYING_VARIANTS, ROPE_RECIPES
    from .study.plan import VARIANTS

    s = commands.add_parser(
        "study", help="The extension study: each method on each base, untrained and after an equal budget."
    )
    s.add_argument(
        "--preset",
        choices=("mini", "copying", "copying-rope", "full", "minilm-mini"),
        default="full",
        help=STUDY_PRESETS,
    )
    s.add_argument(
        "--phase",
        choices=("quick", "long"),
        default=None,
        help="Phase of the full study: quick (every variant, a small budget) or long (the quick phase's best four and the original, longer; run quick first).",
    )
    _list_flag(
        s,
        "--model",
        choices=("gpt2", "minilm"),
        metavar="MODEL",
        help="Only these bases of the text study: gpt2, minilm (default: the preset's).",
    )
    copying_only = [v for v in (*COPYING_VARIANTS, *ROPE_RECIPES) if v not in VARIANTS]
    _list_flag(
        s,
        "--variants",
        metavar="VARIANT",
        help=f"Subset of {' '.join(VARIANTS)} (default: all; the long phase: the quick phase's best four); the copying presets "
        f"also take {' '.join(copying_only)}.",
    )
    s.add_argument("--steps", type=int, default=None, help="Training steps per variant (default: the preset's budget).")
    s.add_argument(
        "--lr",
        type=float,
        default=None,
        help="Peak learning rate of the variants and the baseline (default: the preset's).",
    )
    s.add_argument(
        "--no-baseline", action="store_true", help="Skip training the original the same steps at its own length."
    )
    _study_folders(s)
    _text_study_options(s)
    _copying_options(s)
    _renamed(s, "--base", "--model")
    _renamed(s, "--budget", "--phase")
    s.set_defaults(run=_cmd_study)


STUDY_PRESETS = (
    "mini: the copier (a small GPT-2 that copies inside its 256 positions) trained from its recipe, then patched with the "
    "best method and with RoPE, each trained briefly at 4x and probed (<= 6 min on 2 CPU cores); copying: every method "
    "on the copier, three seeds (results/copying/); copying-rope: RoPE recipes on the copier, 300 steps "
    "(results/copying-rope/); full: the text study on both bases (results/); minilm-mini: the repeat probe on MiniLM "
    "before and after a short ALiBi training."
)


def _study_folders(s: argparse.ArgumentParser) -> None:
    """Where the study runs and writes."""
    s.add_argument(
        "--device",
        default=None,
        help="Where training and scoring run: cpu, cuda, cuda:N (default: cuda if available, else cpu).",
    )
    s.add_argument(
        "--work", default=None, help="Folder for the trained runs (default out/study-PRESET); finished runs are reused."
    )
    s.add_argument(
        "--out", default=None, help="Folder for the results (default results/ for full, WORK/results for mini)."
    )
    s.add_argument(
        "--report-only",
        action="store_true",
        help="Rebuild summary.md and the plots from the saved results; train and score nothing.",
    )
    s.add_argument(
        "--docs",
        default=None,
        metavar="DIR",
        help="With --report-only: write every study page of the documentation site (DIR/study/*.md) from the results "
        "under --out (default results/), whatever the preset.",
    )


def _text_study_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--repeat-fraction",
        type=float,
        default=None,
        help="Share of the variants' and the baseline's training windows that carry a 64-token span copied further on (data.repeat_fraction; default 0): for a base that copies, so the repeat probe can show it.",
    )
    s.add_argument(
        "--reference",
        default=None,
        help="Folder of the reference GPT-2, an unpatched GPT-2 with 256 positions (default: out/reference-gpt2/model, pretrained if missing).",
    )


def _copying_options(s: argparse.ArgumentParser) -> None:
    s.add_argument(
        "--seeds",
        type=int,
        default=None,
        help="Copying presets: number of seeds (training order and probe draws; default: the preset's).",
    )
    s.add_argument(
        "--build-copier",
        action="store_true",
        default=None,  # None when not given, as every preset-family flag (_refuse_other_family)
        help="Copying presets: train the copier from its recipe again (about 4 min on 2 cores), even if the work folder or posswap (for copying and copying-rope) has one.",
    )
    s.add_argument(
        "--jobs", type=int, default=None, help="Copying presets: runs at once, one CPU thread each (default 2)."
    )


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
# a file that is not YAML, no memory for what was asked.
_USER_ERRORS = (ValueError, TypeError, OSError, yaml.YAMLError, MemoryError)


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
