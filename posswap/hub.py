"""Share a patched model on the Hub: a model card that says what was patched and how it scores, and a push
through the real ``huggingface_hub`` client (so ``HF_ENDPOINT``, ``HF_TOKEN`` and ``hf auth login`` apply).

transformers' own ``model.push_to_hub`` keeps working (config.json carries the posswap block) but writes
transformers' generic card, or keeps the card already on the repo. ``posswap.push_to_hub(model, ...)`` saves
with ``save_pretrained`` into a temporary folder, adds the posswap card and uploads that.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from .config import check_flags
from .evaluation.results import Results
from .portable.posswap_block import migrate_block
from .portable.posswap_runtime import needs_runtime_code
from .registry import registered
from .sentence_models import CardLoader, is_sentence_transformer, loading_lines, save, transformer_module
from .version import __version__

CARD_MARKER = "<!-- posswap model card -->"  # lets a later push tell its own card from one the user wrote
# Seconds the Hub may stay silent (connecting, or between bytes of an answer) before a push gives up; huggingface_hub's
# client waits forever, so a server that accepts the commit and never answers would hang the push.
HUB_TIMEOUT = float(os.environ.get("POSSWAP_HUB_TIMEOUT") or 60)


def model_card(
    name_or_path: Any,
    results: Results | str | os.PathLike | None = None,
    base_model: str | None = None,
    data: str | None = None,
    steps: int | None = None,
    plots: Iterable[str] = (),
    license: str | None = None,
    repo_id: str | None = None,
) -> str:
    """A Hub model card (README.md text) for a patched model or the folder ``save_pretrained`` wrote.

    ``results`` is a :class:`posswap.Results` or the path of its ``results.json``; ``plots`` are image paths
    as they will be in the repo (``plots/ppl_vs_length.png``); ``repo_id`` goes into the loading snippet.
    Sections without data are left out.
    """
    from huggingface_hub import ModelCard, ModelCardData

    config, block = _patched_block(name_or_path)
    base_model = base_model or _hub_id(config.get("_name_or_path") or getattr(name_or_path, "name_or_path", None))
    method = block["method"]
    sentence = _is_sentence_transformers(name_or_path)
    meta = ModelCardData(
        library_name="sentence-transformers" if sentence else "transformers",
        base_model=base_model,
        tags=["posswap", method] + ["sentence-transformers"] * sentence,
        license=license,
    )
    repo = json.dumps(repo_id or "<repo id>")
    lines = _patch_section(config, block, base_model)
    name = (config.get("architectures") or ["AutoModel"])[0]
    lines += loading_lines(block, repo) if sentence else _loading_section(method, name, repo, block)
    lines += _training_section(data, steps) + _results_section(results)
    plots = list(plots)
    if plots:
        lines += ["## Plots", ""] + [f"![{Path(p).stem}]({p})" for p in plots] + [""]
    return str(ModelCard(f"---\n{meta.to_yaml()}\n---\n\n" + "\n".join(lines)))


def _patched_block(name_or_path: Any) -> tuple[dict, dict]:
    """The config (as a dict) and its posswap block, checked; an unpatched model or folder is a one-line error."""
    config = _config_dict(name_or_path)
    block = migrate_block(config.get("posswap"))  # a folder saved by an older posswap: keys renamed since
    if block and isinstance(name_or_path, (str, os.PathLike)):
        from .loading import check_posswap_block

        check_posswap_block(block, str(name_or_path))  # a hand-edited block is named, not a KeyError
    if not block:
        raise ValueError(
            f"{_describe(name_or_path)} has no 'posswap' block in its config: it is not a patched model. "
            "Patch it with posswap.patch(model, ...) and save it with save_pretrained first."
        )
    return config, block


def _patch_section(config: dict, block: dict, base_model: str | None) -> list[str]:
    """The card's title, what was patched, and the method's parameters."""
    method = block["method"]
    parameters = {k: v for k, v in block.items() if k not in ("method", "max_length", "original_length", "version")}
    lines = [
        CARD_MARKER,
        f"# {base_model or config.get('model_type', 'model')} with {method} positions ({block['max_length']} tokens)",
        "",
        f"This {config.get('model_type', '')} checkpoint was patched with posswap"
        f" {block.get('version', '')}: method `{method}`, context length {block.get('original_length', '?')}"
        f" -> {block['max_length']} tokens.",
        "",
    ]
    if parameters:
        rows = [f"| `{k}` | {'default' if v is None else f'`{v}`'} |" for k, v in parameters.items()]
        lines += ["| parameter | value |", "|---|---|", *rows, ""]
    return lines


def _training_section(data: str | None, steps: int | None) -> list[str]:
    if data is None and steps is None:
        return []
    lines = ["## Training", ""]
    lines += [f"- data: {data}"] if data is not None else []
    lines += [f"- steps: {steps}"] if steps is not None else []
    return lines + [""]


def _results_section(results: Results | str | os.PathLike | None) -> list[str]:
    if results is None:
        return []
    results = results if isinstance(results, Results) else Results.load(results)
    return [
        "## Evaluation",
        "",
        f"Data: {results.data}; context lengths {', '.join(map(str, results.lengths))}.",
        "",
        "```",
        results.table(),
        "```",
        "",
    ]


def push_to_hub(
    name_or_path: Any,
    repo_id: str,
    *,
    tokenizer: Any = None,
    card: str | None = None,
    results: Results | str | os.PathLike | None = None,
    plots: Iterable[str | os.PathLike] = (),
    base_model: str | None = None,
    data: str | None = None,
    steps: int | None = None,
    license: str | None = None,
    private: bool = False,
    token: str | None = None,
    commit_message: str = "Upload posswap model",
) -> str:
    """Upload a patched model with its card to ``repo_id``; return the repo URL.

    ``name_or_path`` is a folder that ``save_pretrained`` wrote or a patched model (saved, with ``tokenizer`` if
    given, to a temporary folder). The repo gets README.md (the card) and ``plots/`` beside the folder's files:
    ``card`` when given, else one made by :func:`model_card` unless the folder has a README.md posswap did not
    write. Nothing is written into the folder; links in it that point outside it are skipped (and named).
    A Hub that does not answer for ``HUB_TIMEOUT`` seconds (``POSSWAP_HUB_TIMEOUT``) ends the push with an OSError.
    """
    check_flags(private=private)  # "no" would make a private repo
    token = check_hub_target(repo_id, token)  # everything that can fail locally fails before the first request
    plots = [Path(p) for p in plots]
    missing = [str(p) for p in plots if not p.is_file()]
    if missing:
        raise ValueError(f"Plot file(s) not found: {', '.join(missing)}.")
    card_args = dict(results=results, base_model=base_model, data=data, steps=steps, license=license)

    with tempfile.TemporaryDirectory(prefix="posswap-push-") as tmp:
        folder = _folder_to_push(name_or_path, tokenizer, Path(tmp))
        extra: dict[str, Any] = {f"plots/{plot.name}": plot for plot in plots}  # beside; the folder is left as it is
        card = _card_to_push(name_or_path, folder, card, card_args, plots, repo_id)
        if card is not None:
            extra["README.md"] = card.encode("utf-8")
        again = (
            f"run `posswap push {folder} {repo_id}` again"
            if isinstance(name_or_path, (str, os.PathLike))
            else "push again"
        )
        return upload_folder(folder, repo_id, private, token, commit_message, extra=extra, again=again)


def _folder_to_push(name_or_path: Any, tokenizer: Any, tmp: Path) -> Path:
    """The folder given, or a model saved (with its tokenizer) into ``tmp``."""
    if isinstance(name_or_path, (str, os.PathLike)):
        folder = Path(name_or_path)
        if not (folder / "config.json").is_file():
            raise ValueError(f"{folder} has no config.json: pass a folder that save_pretrained wrote.")
        return folder
    save(name_or_path, tmp, card=False)  # a SentenceTransformer as one, with posswap's card below
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp)
    return tmp


def _card_to_push(name_or_path, folder: Path, card: str | None, card_args: dict, plots: list[Path], repo_id: str):
    """The README.md to upload: ``card``, else posswap's own; None to leave the folder's (a README.md the user
    wrote, or a native export's folder, which has no posswap block)."""
    if card is not None:
        return card
    readme = folder / "README.md"
    ours = not readme.exists() or CARD_MARKER in readme.read_text(encoding="utf-8")
    asked = any(v is not None for v in card_args.values()) or bool(plots)  # what only posswap's card shows
    if not ours and asked:
        raise ValueError(
            f"{readme} was not written by posswap, so the results/plots would not reach the card: "
            f"remove it, or pass card=posswap.model_card(...)."
        )
    native = isinstance(name_or_path, (str, os.PathLike)) and not _config_dict(folder).get("posswap")
    if native and asked:
        raise ValueError(
            f"{folder} has no posswap block (a native export?), so posswap writes no card for it: push it "
            "without results or plots."
        )
    if not ours or native:
        return None
    return model_card(name_or_path, plots=[f"plots/{p.name}" for p in plots], repo_id=repo_id, **card_args)


def check_hub_target(repo_id: str, token: str | None) -> str:
    """The token to push ``repo_id`` with; a malformed id or a missing login is an error before any request."""
    from huggingface_hub import get_token
    from huggingface_hub.utils import validate_repo_id

    try:
        validate_repo_id(repo_id)
    except ValueError as error:
        raise ValueError(f"Bad repo id {repo_id!r}: use 'namespace/name', e.g. 'me/gpt2-rope-4k'. ({error})") from None
    token = token or get_token()
    if token is None:
        raise ValueError("Not logged in to the Hub: run `hf auth login`, set HF_TOKEN, or pass token=...")
    return token


def upload_folder(
    folder: Path,
    repo_id: str,
    private: bool,
    token: str,
    commit_message: str,
    extra: dict[str, Any] | None = None,
    again: str = "push again",
) -> str:
    """Create the repo if needed and upload ``folder`` (and ``extra``: repo path -> a file's path or its bytes,
    in place of the folder's file of that name) in one commit; returns the repo URL. Links that point outside
    ``folder`` are skipped and named on stderr; nothing is written into ``folder``."""
    from huggingface_hub import CommitOperationAdd, HfApi

    files, skipped = folder_files(Path(folder))
    if skipped:
        print(
            f"posswap push: skipped {len(skipped)} link(s) that point outside {folder}: {', '.join(skipped)} "
            "(copy the files in to upload them).",
            file=sys.stderr,
        )
    files.update(extra or {})
    operations = [
        CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(data) if isinstance(data, Path) else data)
        for name, data in sorted(files.items())
    ]
    api = HfApi(library_name="posswap", library_version=__version__)  # named in the user agent
    with hub_timeout(again):
        url = api.create_repo(repo_id, exist_ok=True, private=private, token=token)
        api.create_commit(repo_id=url.repo_id, operations=operations, commit_message=commit_message, token=token)
    return str(url)


def folder_files(folder: Path) -> tuple[dict[str, Path], list[str]]:
    """What a push of ``folder`` uploads (repo path -> file) and the links it skips because they leave the folder.
    As ``HfApi.upload_folder``: not ``.git/`` nor ``.cache/huggingface/``; a link to a file in the folder is
    uploaded as that file; a link to a folder is not followed (what it points to inside is uploaded anyway)."""
    root = folder.resolve()
    files, skipped = {}, []
    for parent, dirs, names in os.walk(folder):
        here = Path(parent)
        for name in sorted(dirs):
            if (here / name).is_symlink() and not _inside(here / name, root):
                skipped.append(str((here / name).relative_to(folder)))
        dirs[:] = sorted(d for d in dirs if not (here / d).is_symlink())
        for name in sorted(names):
            path = here / name
            relative = path.relative_to(folder).as_posix()
            if relative.startswith((".git/", ".cache/huggingface/")):
                continue
            if path.is_symlink() and not _inside(path, root):
                skipped.append(relative)
            elif path.is_file():
                files[relative] = path
    return files, sorted(skipped)


def _inside(path: Path, root: Path) -> bool:
    return path.resolve().is_relative_to(root)


_TIMEOUT_LOCK = threading.Lock()
_TIMEOUT_USERS: list = []  # [the session's own timeout, one entry per push running now]


@contextlib.contextmanager
def hub_timeout(again: str):
    """huggingface_hub's shared client with ``HUB_TIMEOUT`` for the requests made inside; a silent or unreachable Hub
    becomes an OSError that says what to do."""
    from huggingface_hub import constants
    from huggingface_hub.utils import get_session

    try:
        import httpx2 as httpx  # the client huggingface_hub 2.x uses
    except ImportError:
        import httpx
    session = get_session()
    # Pushes from several threads share the session: the first sets the timeout, the last restores it.
    with _TIMEOUT_LOCK:
        if not _TIMEOUT_USERS:
            _TIMEOUT_USERS.append(session.timeout)
        _TIMEOUT_USERS.append(None)
        session.timeout = httpx.Timeout(HUB_TIMEOUT)
    try:
        yield
    except httpx.TimeoutException:
        raise TimeoutError(
            f"the Hub at {constants.ENDPOINT} did not answer within {HUB_TIMEOUT:g} s; check the connection and "
            f"{again} (set POSSWAP_HUB_TIMEOUT=SECONDS to wait longer)."
        ) from None
    except httpx.TransportError as error:  # refused, reset, dropped, DNS
        raise ConnectionError(
            f"could not reach the Hub at {constants.ENDPOINT} ({type(error).__name__}: {error}); check the connection "
            f"and {again}."
        ) from None
    finally:
        with _TIMEOUT_LOCK:
            _TIMEOUT_USERS.pop()
            if len(_TIMEOUT_USERS) == 1:
                session.timeout = _TIMEOUT_USERS.pop()  # the session's own timeout, as before the first push


def _loading_section(method: str, name: str, repo: str, block: dict) -> list[str]:
    """How to load it: with posswap; with transformers alone (the folder carries the code, or needs none);
    and, where one is exact, the native export for serving engines."""
    stock = name.removeprefix("Posswap")
    loader = CardLoader(
        posswap_note="",
        alone="plain transformers",
        plain_import=f"from transformers import {stock}",
        plain_call=stock + ".from_pretrained({repo})",
        library="transformers",
        refused="transformers refuses to load it",
        remote_import="from transformers import AutoModel",
        remote_call="AutoModel.from_pretrained({repo}, trust_remote_code=True)  # or AutoModelForCausalLM, ...",
    )
    lines = loading_lines(block, repo, loader)
    if not needs_runtime_code(block):
        return lines
    spec = registered().get(method)
    if spec is not None and spec.export_refusal is not None and spec.export_refusal(block) is None:
        lines += [
            "For serving engines (vLLM, TGI, llama.cpp), `posswap export` writes an exact native copy where one",
            "exists (GPT-2 -> GPT-NeoX, BERT family -> RoFormer), checked against this model before writing:",
            "",
            "```bash",
            f"posswap export {repo.strip(chr(34))} --out native/",
            "```",
            "",
        ]
    return lines


def _config_dict(name_or_path: Any) -> dict:
    if isinstance(name_or_path, (str, os.PathLike)):
        path = Path(name_or_path) / "config.json"
        if not path.is_file():
            raise ValueError(f"{name_or_path} has no config.json: pass a folder that save_pretrained wrote.")
        return json.loads(path.read_text())
    if is_sentence_transformer(name_or_path):  # its transformer's config
        name_or_path = transformer_module(name_or_path).auto_model
    config = getattr(name_or_path, "config", None)
    if config is None:
        raise TypeError(f"Expected a transformers model or a folder, got {type(name_or_path).__name__}.")
    # architectures is only filled in by save_pretrained; the loading snippet needs the class now.
    return {**config.to_dict(), "architectures": [type(name_or_path).__name__]}


def _is_sentence_transformers(name_or_path: Any) -> bool:
    if isinstance(name_or_path, (str, os.PathLike)):
        return (Path(name_or_path) / "modules.json").is_file()
    return is_sentence_transformer(name_or_path)


def _hub_id(name: str | None) -> str | None:
    """``gpt2`` or ``openai-community/gpt2`` are Hub ids; a local folder is not a base model to link to."""
    if not name or os.path.exists(name) or name.count("/") > 1:
        return None
    return name


def _describe(name_or_path: Any) -> str:
    return str(name_or_path) if isinstance(name_or_path, (str, os.PathLike)) else type(name_or_path).__name__
