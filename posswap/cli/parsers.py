"""The parsers of ``posswap patch|demo|eval|train|push|export`` (``study``'s is in ``cli/study.py``): flags and help
only. What they show of the library comes from ``cli/facts.py``, so building them imports no torch; each command's
handler is in ``cli/commands.py``."""

from __future__ import annotations

import argparse

from . import commands as handlers
from .args import Renamed, described, list_flag, renamed, yaml_value
from .facts import DEMO_CONTEXT_DOCUMENTS, DEMO_HAYSTACKS, METHOD_OPTIONS, PASSKEY_DEPTHS, RENAMED_KEYS


def _method_options(parser: argparse.ArgumentParser) -> None:
    """One flag per config field of any method (``--rope-type``, ``--theta``, ...); listed per method in the epilog,
    each with its own method's text."""
    seen: set[str] = set()
    for options in METHOD_OPTIONS.values():
        for name, help_text in options.items():
            if name not in seen:
                seen.add(name)
                shown = name == "max_length"  # every method's: in the options list
                parser.add_argument(
                    "--" + name.replace("_", "-"),
                    dest=name,
                    type=yaml_value,
                    help=help_text if shown else argparse.SUPPRESS,
                )


def _method_help() -> str:
    """Each method's own options with its own help text (the epilog of ``posswap patch --help``)."""
    import textwrap

    lines = ["method options (a method takes only its own; values are YAML: 4096, 0.5, yarn, true, null):"]
    for method, options in METHOD_OPTIONS.items():
        lines.append(f"  --method {method}:" + ("" if len(options) > 1 else " (no options)"))
        for name, help_text in options.items():
            if name != "max_length":
                flag = f"    --{name.replace('_', '-')}"
                lines.append(textwrap.fill(help_text, 118, initial_indent=f"{flag:<26}", subsequent_indent=" " * 26))
    return "\n".join(lines)


def add_patch(commands) -> None:
    p = commands.add_parser(
        "patch",
        help="Patch a checkpoint and save it (with its tokenizer) to a folder.",
        epilog=_method_help(),
        **described(
            "Load MODEL (a checkpoint of a family in docs/families.md, or a sentence-transformers model), give it --method's "
            "position handling at --max-length tokens, and save it with its tokenizer to --out, a folder that "
            "posswap.from_pretrained loads, and transformers with trust_remote_code=True. The flags, --out and the "
            "model's own length are checked before anything loads.",
            "posswap patch gpt2 --method rope --max-length 4096 --out gpt2-rope-4k",
        ),
    )
    p.add_argument(
        "model",
        metavar="MODEL",
        help="Hub id or local folder of a checkpoint with a learned position table (docs/families.md).",
    )
    p.add_argument("--method", required=True, choices=sorted(METHOD_OPTIONS), help="Position method to apply.")
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
    p.set_defaults(run=handlers.patch_command)


DEMO_STEPS, DEMO_TEACHER_STEPS = 12, 4  # the chunk teacher's share: a third (minilm-embed-2k: 64 documents, 192 pairs)


def add_demo(commands) -> None:
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
    d.set_defaults(run=handlers.demo_command)


def add_eval(commands) -> None:
    e = commands.add_parser(
        "eval",
        help="Score models at each context length; write results.json and PNG plots.",
        **described(
            "Score each MODEL, patched or stock, at each of --lengths. The text task (default): perplexity, or "
            "masked-LM loss for encoders, and passkey retrieval for causal LMs, written to --out as results.json "
            "and PNG plots. The retrieval tasks (--task passkey-retrieval, needle-retrieval, context-retrieval) "
            "score sentence-transformers models on long documents, beside chunking baselines (--baselines). A "
            "length far past what every model reads is refused before any text is built.",
            "posswap eval gpt2 out/gpt2-rope-4k --lengths 256 1024 4096 --out report/",
        ),
    )
    e.add_argument("models", nargs="+", metavar="MODEL", help="Hub ids or local folders (patched or stock).")
    list_flag(
        e,
        "--lengths",
        int,
        metavar="LENGTH",
        help=f"Context lengths (default {' '.join(map(str, handlers.DEFAULT_LENGTHS))}).",
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
        help=f"Depths of the key, 0 to 1 (default {' '.join(map(str, PASSKEY_DEPTHS))}).",
    )
    e.add_argument("--seed", type=int, default=0, help="Seed of the masks and keys (the same for every model).")
    e.add_argument(
        "--device", default=None, help="Where the models run: cpu, cuda, cuda:N (default: cuda if available, else cpu)."
    )
    _add_retrieval_flags(e)
    e.set_defaults(run=handlers.eval_command)


def _add_retrieval_flags(e) -> None:
    e.add_argument(
        "--task",
        choices=("text", "passkey-retrieval", "needle-retrieval", "context-retrieval", "natural-context-retrieval"),
        default="text",
        help="text (default): the scores above. passkey-retrieval, needle-retrieval: LongEmbed's long-document "
        "retrieval for sentence-transformers models (retrieval.json, retrieval.png; default lengths 256 512 1024 2048). "
        "context-retrieval: chunks whose facts are about a subject named elsewhere in their document (context.json; "
        "default lengths 512 1024 2048 4096). natural-context-retrieval: a real passage of Persuasion in copies "
        "under other names, asked about a chunk that names nobody: only its document tells the copies apart "
        "(context.json; --documents counts the copies).",
    )
    e.add_argument(
        "--chunk-tokens",
        type=int,
        default=None,
        help="context-retrieval, natural-context-retrieval: the most tokens a chunk holds, special tokens counted "
        "(default 128).",
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


def add_train(commands) -> None:
    t = commands.add_parser(
        "train",
        help="Continued pretraining at the new length from a recipe (a YAML file, or a shipped one by name).",
        **described(
            "Patch the recipe's base model and train it further at its new length (causal LM for GPT-2, masked LM "
            "for BERT, pairs for sentence-transformers models), as RECIPE says: a YAML file, or a shipped recipe by "
            "name (--list shows them with their purpose). --set overrides recipe values; every value is checked "
            "before anything loads. The model is saved to train.output_dir/model, with checkpoints on the way "
            "(--resume continues from the latest).",
            "posswap train gpt2-rope-4k --set train.max_steps=200",
        ),
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
    t.set_defaults(run=handlers.train_command)


def add_push(commands) -> None:
    h = commands.add_parser(
        "push",
        help="Upload a saved model (patched, or a native export) to the Hub with a posswap model card.",
        **described(
            "Upload FOLDER (what posswap patch, train or export, or save_pretrained on a patched model wrote) to the "
            "Hub repo REPO_ID, created if missing, with a model card that says what was patched and how; --results "
            "adds posswap eval's table to the card, --plots its pictures.",
            "posswap push out/gpt2-rope-4k me/gpt2-rope-4k --results report/results.json",
        ),
    )
    h.add_argument(
        "folder", metavar="FOLDER", help="Folder that save_pretrained, posswap patch or posswap export wrote."
    )
    h.add_argument("repo_id", metavar="REPO_ID", help="Hub repo, e.g. me/gpt2-rope-4k (created if missing).")
    h.add_argument("--private", action="store_true", help="Create the repo as private.")
    h.add_argument("--results", default=None, help="results.json from posswap eval: its table goes into the card.")
    list_flag(h, "--plots", metavar="PNG", help="Images to upload under plots/ and show in the card.")
    h.set_defaults(run=handlers.push_command)


def add_export(commands) -> None:
    x = commands.add_parser(
        "export",
        help="Write a RoPE model as a native transformers model where one is exact (GPT-NeoX, RoFormer), or an "
        "embedding model as an ONNX graph (--format onnx).",
        **described(
            "Write MODEL in a form that runs without posswap. --format native (default): a RoPE model as the "
            "transformers architecture that computes the same logits (GPT-2 as GPT-NeoX, the BERT family as "
            "RoFormer), compared before anything is written. --format onnx: a stock or patched model (every method; "
            "RoPE's dynamic scaling excepted), as an ONNX graph that onnxruntime runs and "
            "posswap.OnnxEncoder serves (a sentence-transformers model in its own ONNX layout); --int8 "
            "adds a quantised copy. MODEL's files are checked "
            "before any work.",
            "posswap export out/gpt2-rope-4k --out out/gpt2-rope-4k-neox",
        ),
    )
    x.add_argument(
        "folder",
        metavar="MODEL",
        help="Folder (or Hub id) of the model: posswap-patched (--format native), patched or stock (--format onnx).",
    )
    x.add_argument(
        "--out",
        required=True,
        help="New (or empty) folder for the export: the native model and its tokenizer (--format native), or the "
        "ONNX graph with its config.json and tokenizer (--format onnx).",
    )
    x.add_argument(
        "--overwrite",
        action="store_true",
        help="Replace --out if it is a model folder (holds config.json) written earlier; never MODEL itself.",
    )
    x.add_argument(
        "--format",
        choices=("native", "onnx"),
        default="native",
        help="native: a transformers architecture (RoPE); onnx: an ONNX graph for onnxruntime (posswap.onnx.export).",
    )
    x.add_argument("--int8", action="store_true", help="With --format onnx: also an int8 dynamically quantised graph.")
    x.add_argument(
        "--push",
        action=Renamed,
        message="export no longer pushes; run posswap push OUT REPO_ID (OUT: the --out folder).",
    )
    x.set_defaults(run=handlers.export_command)
