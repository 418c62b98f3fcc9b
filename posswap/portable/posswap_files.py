"""Folders written whole or not at all, by one writer at a time: the lock beside a target, the staging folders
beside it, and ``save_pretrained`` of a patched model written beside its folder and swapped into place.

Names posswap uses beside a target NAME (in NAME's parent folder):

- ``.NAME.posswap-lock``: the lock (``filelock``), held while one process writes NAME; it says who holds it
  (``{"pid": ..., "by": ...}``) and is removed when the holder is done;
- ``.NAME.posswap-staging-PID-XXXX``: the new folder being written;
- ``.NAME.posswap-old-PID-XXXX``: the folder being replaced.

A killed writer leaves them behind; the next write to NAME recognises and removes them (:func:`clean_stale`), and
puts a replaced folder back if the new one never arrived. A lock file nobody holds is never a user's file: it is
left out when a folder is judged empty, and removed by the next writer.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap. ``filelock`` comes with
huggingface_hub, which transformers needs.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import re
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from filelock import FileLock, Timeout

STAGING, RETIRED, LOCK = "posswap-staging", "posswap-old", "posswap-lock"
_OURS = re.compile(rf"^\.(?P<name>.+)\.(?P<kind>{STAGING}|{RETIRED})-(?P<pid>\d+)-[0-9a-f]+$")
_LOCK_NAME = re.compile(rf"^\..+\.{LOCK}$")
# Weight files of a model saved earlier into a folder: a new save supersedes them all (transformers itself leaves
# e.g. an old model.safetensors beside a new sharded save, and loads the old one).
_WEIGHTS = re.compile(
    r"^(model|pytorch_model|tf_model|flax_model)([.-].*)?\.(safetensors|bin|h5|msgpack)(\.index\.json)?$"
)


def absolute(path: str | os.PathLike) -> Path:
    """``.`` and ``out/..`` made absolute without following links, so the target always has a name."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def lock_path(target: Path) -> Path:
    return target.parent / f".{target.name}.{LOCK}"


class Busy(ValueError):
    """Another process holds the lock of a target; ``pid`` and ``by`` say who, as far as its lock file tells."""

    def __init__(self, message: str, pid: int | None, by: str | None):
        super().__init__(message)
        self.pid, self.by = pid, by


def _holder(path: Path) -> tuple[int | None, str | None]:
    try:
        data = json.loads(path.read_text())
        return int(data["pid"]), str(data.get("by") or "")
    except (OSError, ValueError, KeyError, TypeError):
        return None, None  # written a moment from now, or by a posswap without this record


@contextlib.contextmanager
def hold(target: Path, by: str, refusal: Callable[[int | None, str | None], str]) -> Iterator[None]:
    """Hold ``target``'s lock for the block; refuse at once (:class:`Busy`, message ``refusal(pid, by)``) when
    another process (or another call in this one) holds it. Folders made for the lock file, and the lock file
    itself, are removed afterwards: nothing is left behind when the block writes nothing."""
    made = [p for p in reversed(target.parents) if not p.exists()]
    target.parent.mkdir(parents=True, exist_ok=True)
    path = lock_path(target)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        pid, holder = _holder(path)
        _remove_made(made)
        raise Busy(refusal(pid, holder), pid, holder) from None
    try:
        path.write_text(json.dumps({"pid": os.getpid(), "by": by}))
        yield
    finally:
        # Unlinked while still held: a process that opened the old file and locks it after the release sees it
        # unlinked (filelock checks) and starts again on a new file, so two holders never overlap.
        with contextlib.suppress(OSError):
            path.unlink()
        lock.release()
        _remove_made(made)


def _remove_made(made: list[Path]) -> None:
    for folder in reversed(made):
        with contextlib.suppress(OSError):  # not empty: something was written there, and stays
            folder.rmdir()


def _stale_lock(path: Path) -> bool:
    """A posswap lock file that no process holds (its writer was killed): not a user's file."""
    if not _LOCK_NAME.match(path.name) or not path.is_file() or path.is_symlink():
        return False
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        return False
    lock.release()
    return True


def entries(folder: Path) -> list[Path]:
    """What ``folder`` holds, less lock files that nobody holds."""
    return [p for p in folder.iterdir() if not _stale_lock(p)]


def clean_stale(target: Path) -> None:
    """Remove what a killed write to ``target`` left: its staging folder, the replaced model folder (put back if the
    new one never arrived), and lock files nobody holds inside it. Folders of writes still running are left alone."""
    if target.is_symlink() or not target.parent.is_dir():
        return
    for path in target.parent.iterdir():
        match = _OURS.match(path.name)
        if not match or match["name"] != target.name or _running(int(match["pid"])):
            continue
        if match["kind"] == RETIRED and not target.exists():
            os.replace(path, target)
        elif match["kind"] == RETIRED and target.is_dir() and not entries(target):
            shutil.rmtree(target)  # empty, or only stale locks
            os.replace(path, target)
        else:
            shutil.rmtree(path, ignore_errors=True)
    if target.is_dir():
        for path in target.iterdir():
            match = _OURS.match(path.name)
            if match and match["kind"] == STAGING and match["name"] == target.name and not _running(int(match["pid"])):
                shutil.rmtree(path, ignore_errors=True)  # staged inside the folder (_save_in_place)
            elif _stale_lock(path):
                with contextlib.suppress(OSError):
                    path.unlink()


def new_name(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def is_staging(path: Path) -> bool:
    match = _OURS.match(path.name)
    return match is not None and match["kind"] == STAGING


def swap_into_place(staging: Path, target: Path) -> None:
    """Rename ``staging`` to ``target``; a non-empty ``target`` is moved aside first and removed once the new one is
    in. A process whose working folder was inside ``target`` is moved to the same path in the new one."""
    cwd = _cwd()
    inside = cwd is not None and (cwd == target or target in cwd.parents)
    if target.exists() and any(target.iterdir()):
        retired = new_name(target, RETIRED)
        os.replace(target, retired)
        try:
            os.replace(staging, target)
        except OSError:
            os.replace(retired, target)  # the earlier folder stays
            raise
        shutil.rmtree(retired)
    else:
        os.replace(staging, target)  # rename(2) replaces an empty folder
    if inside:
        os.chdir(cwd if cwd.is_dir() else target)


def _cwd() -> Path | None:
    try:
        return Path(os.getcwd())
    except OSError:  # already removed
        return None


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True


# -- save_pretrained of a patched model ---------------------------------------------------------------------------


class AtomicSave:
    """``model.save_pretrained`` for a patched model: transformers' own method writes into a staging folder beside
    the target, which then replaces it, under the target's lock. A kill at any moment leaves the earlier folder as
    it was (never a new config.json over old weights). Files of the earlier folder that the save does not write
    (a tokenizer, a README) are kept; its old weight files are not.

    An object, not a closure: ``copy.deepcopy`` and pickling give the copy its own. Set on the instance by
    :func:`install_atomic_save` (the model keeps its transformers class).
    """

    def __init__(self, model):
        self.model = model

    def __call__(self, save_directory, *args, **kwargs):
        model = self.model
        save = type(model).save_pretrained
        arguments = inspect.signature(save).bind(model, save_directory, *args, **kwargs).arguments
        extra = arguments.get("kwargs", {})
        target = Path(os.path.realpath(os.path.expanduser(str(save_directory))))  # a link: the folder it names
        direct = (
            arguments.get("push_to_hub")
            or arguments.get("distributed_checkpoint")
            or extra.get("push_to_hub")
            or not arguments.get("is_main_process", True)
            or target.is_file()
            or is_staging(target)
        )
        if direct:  # transformers' own handling (upload, sharded writes on every rank, errors); or already staged
            return save(model, save_directory, *args, **kwargs)
        with hold(target, "save_pretrained", lambda pid, by: _busy_message(target, pid, by)):
            clean_stale(target)
            if os.path.ismount(target):  # a mounted folder cannot be renamed: replace its files one by one
                return _save_in_place(save, model, target, args, kwargs)
            staging = new_name(target, STAGING)
            staging.mkdir()
            try:
                save(model, staging, *args, **kwargs)
                if target.is_dir():
                    _keep_other_files(target, staging)
                    os.chmod(staging, target.stat().st_mode & 0o7777)
                swap_into_place(staging, target)
            finally:
                if staging.exists():
                    shutil.rmtree(staging)

    def __repr__(self) -> str:
        return f"<posswap atomic save_pretrained of {type(self.model).__name__}>"


def _busy_message(target: Path, pid: int | None, by: str | None) -> str:
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return (
        f"save_pretrained({str(target)!r}): another posswap process ({who}{', ' + by if by else ''}) is writing that "
        "folder now; wait for it to finish, or save to another folder."
    )


def _keep_other_files(old: Path, new: Path) -> None:
    """Put what ``old`` holds besides the model (tokenizer, card, the user's files) into ``new``: hard links where
    possible (no copy of large files; the old names go with the old folder), else copies."""
    for entry in old.iterdir():
        if (
            os.path.lexists(new / entry.name)
            or _WEIGHTS.match(entry.name)
            or _OURS.match(entry.name)
            or _stale_lock(entry)
        ):
            continue
        if entry.is_symlink():
            os.symlink(os.readlink(entry), new / entry.name)
        elif entry.is_dir():
            shutil.copytree(entry, new / entry.name, symlinks=True, copy_function=_link_or_copy)
        else:
            _link_or_copy(entry, new / entry.name)


def _link_or_copy(source, destination) -> None:
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _save_in_place(save, model, target: Path, args, kwargs) -> None:
    """Where ``target`` cannot be renamed (a mount point): stage inside it, then move the files in with config.json
    last, after the old one is removed, so that a kill part-way leaves a folder that refuses to load (no
    config.json), never a new config over old weights."""
    staging = target / new_name(target, STAGING).name
    staging.mkdir()
    try:
        save(model, staging, *args, **kwargs)
        (target / "config.json").unlink(missing_ok=True)
        for entry in target.iterdir():
            if _WEIGHTS.match(entry.name) and entry.is_file():
                entry.unlink()
        for entry in sorted(staging.iterdir(), key=lambda p: p.name == "config.json"):  # config.json last
            destination = target / entry.name
            if destination.is_dir() and not destination.is_symlink():
                shutil.rmtree(destination)
            os.replace(entry, destination)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def install_atomic_save(model) -> None:
    """Idempotent. ``model.save_pretrained`` becomes :class:`AtomicSave` for this instance only."""
    current = model.__dict__.get("save_pretrained")
    if not (isinstance(current, AtomicSave) and current.model is model) and hasattr(type(model), "save_pretrained"):
        object.__setattr__(model, "save_pretrained", AtomicSave(model))
