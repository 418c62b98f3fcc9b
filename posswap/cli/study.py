"""``posswap study``: its parser and what it runs, the text study (``--preset full``, ``minilm-mini``) or the copying
study (``--preset mini``, ``copying``, ``copying-rope``); each family refuses the other's flags."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .args import described, list_flag, renamed
from .facts import COPYING_VARIANTS, ROPE_RECIPES, STUDY_VARIANTS


def add_study(commands) -> None:
    s = commands.add_parser(
        "study",
        help="The extension study: each method on each base, untrained and after an equal budget.",
        **described(
            "Run the extension study: each position method on each base model, untrained and after an equal "
            "training budget, scored at each length. --preset chooses the study (the copying presets on a small "
            "GPT-2 that copies, or the text study on GPT-2 and MiniLM); a stopped run continues where it was, and "
            "--report-only writes the summaries and pictures again from saved results, training nothing.",
            "posswap study --preset mini",
        ),
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
    list_flag(
        s,
        "--model",
        choices=("gpt2", "minilm"),
        metavar="MODEL",
        help="Only these bases of the text study: gpt2, minilm (default: the preset's).",
    )
    copying_only = [v for v in (*COPYING_VARIANTS, *ROPE_RECIPES) if v not in STUDY_VARIANTS]
    list_flag(
        s,
        "--variants",
        metavar="VARIANT",
        help=f"Subset of {' '.join(STUDY_VARIANTS)} (default: all; the long phase: the quick phase's best four, or exactly the ones named), each also as "
        "NAME-distill (trained with the unpatched model as teacher, train.distill); the copying presets "
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
    renamed(s, "--base", "--model")
    renamed(s, "--budget", "--phase")
    s.set_defaults(run=_cmd_study)


STUDY_PRESETS = (
    "mini: the copier (a small GPT-2 that copies inside its 256 positions) trained from its recipe, then patched with the "
    "best method and with RoPE, each trained briefly at 4x and probed (<= 6 min on 2 CPU cores); copying: every method "
    "on the copier, three seeds (results/copying/); copying-rope: RoPE recipes on the copier, 300 steps, "
    "three seeds (results/copying-rope/); full: the text study on both bases (results/); minilm-mini: the repeat probe on MiniLM "
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


def _cmd_study(args: argparse.Namespace) -> None:
    import shlex

    from ..evaluation.stream import resolve_device
    from ..study import Study, select
    from ..study.copying import COPYING_PRESETS

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
    from ..study.docs_report import write_pages

    if not args.report_only:
        raise ValueError("--docs writes the study's pages from saved results: posswap study --report-only --docs DIR.")
    for path in write_pages(Path(args.out or "results"), Path(args.docs)):
        print(f"Wrote {path}")


def _cmd_copying_study(args: argparse.Namespace) -> None:
    import json
    import time

    from ..config import check_number
    from ..study.copying import COPYING_PRESETS, narrowed, run_copying
    from ..study.copying_report import write_report

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
