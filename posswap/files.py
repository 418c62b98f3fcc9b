"""Output folders without data loss: a target is checked before anything is written, the new folder is
staged beside it and renamed into place, and only a model folder (one with ``config.json``) is ever replaced.
One writer at a time: the target's lock (``.NAME.posswap-lock``) is held from the check to the rename, and a
second writer is refused at once.

Staging folders are named ``.NAME.posswap-staging-PID-XXXX`` (and ``.NAME.posswap-old-PID-XXXX`` for the
folder being replaced), so a run that was killed half-way leaves names the next write to NAME recognises.
The machinery is in ``portable/posswap_files.py``, which saved models carry for their own ``save_pretrained``.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path

from .portable.posswap_files import (  # noqa: F401  (LOCK, RETIRED, STAGING, Busy, lock_path: for callers and tests)
    LOCK,
    RETIRED,
    STAGING,
    Busy,
    absolute,
    clean_stale,
    entries,
    hold,
    lock_path,
    new_name,
    swap_into_place,
)


def is_model_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / "config.json").is_file()


def check_folder_target(
    out: str | os.PathLike, overwrite: bool = False, source: str | None = None, flag: str = "--out"
) -> Path:
    """Raise ``ValueError`` unless ``out`` may be written: absent or an empty folder, or (with ``overwrite``)
    a model folder that does not hold ``source``, the model being read. Returns ``out`` made absolute."""
    target = absolute(out)
    if target.parent == target:
        raise ValueError(f"{flag} {out}: cannot write a model to the root of the file system; name a folder.")
    _check_parents(target, flag, out)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ValueError(f"{flag} {out} exists and is not a folder (a file or a link); choose a new folder.")
    if not target.exists() or not entries(target):  # a lock file a killed writer left is not content
        return target
    if not overwrite:
        if _holds(target, source):  # --overwrite would not replace it either: no advice that fails next
            raise _holds_source(flag, out, source)
        raise ValueError(
            f"{flag} {out} already exists and is not empty: choose a new folder, or pass --overwrite to replace "
            "a model folder written earlier."
        )
    if not (target / "config.json").is_file():
        raise ValueError(
            f"{flag} {out} is not a model folder (no config.json), so --overwrite does not replace it; choose a new folder."
        )
    if _holds(target, source):
        raise _holds_source(flag, out, source)
    return target


def _holds(target: Path, source: str | None) -> bool:
    """Whether the folder ``target`` is the folder ``source`` (the model being read) or holds it."""
    if source is None or not os.path.exists(source):
        return False
    real_source, real_target = Path(os.path.realpath(source)), Path(os.path.realpath(target))
    return real_source == real_target or real_target in real_source.parents


def _holds_source(flag: str, out, source: str) -> ValueError:
    return ValueError(f"{flag} {out} holds the model being read ({source}); write the result to another folder.")


def check_writable(out: str | os.PathLike, flag: str = "--out") -> None:
    """Try now what writing ``out`` will need, so that a long job does not end on it: a new folder beside ``out``
    (made and removed again), and, when ``out`` is there already, the right to change it (it is renamed aside or
    replaced). ``OSError`` naming ``flag`` and the reason otherwise."""
    target = absolute(out)
    try:
        if target.parent.is_dir():
            probe = new_name(target, STAGING)
            probe.mkdir()
            probe.rmdir()
        else:
            existing = next(p for p in target.parents if p.exists())
            if not os.access(existing, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", str(existing))
        if target.is_dir() and not target.is_symlink():
            if not os.access(target, os.W_OK | os.X_OK):
                raise PermissionError(13, "Permission denied", str(target))
            status = target.stat()
            if status.st_uid == os.geteuid() or os.geteuid() == 0:  # an immutable folder refuses even its owner
                os.utime(target, ns=(status.st_atime_ns, status.st_mtime_ns))  # the times it has: nothing changes
    except OSError as error:
        reason = error.strerror or type(error).__name__
        where = f" ({error.filename})" if error.filename and Path(error.filename) != target else ""
        raise OSError(
            f"{flag} {out}: cannot write there: {reason}{where}; fix that or choose another folder."
        ) from None


def check_output_dir(out: str | os.PathLike, flag: str = "--out") -> Path:
    """For writers that add their own files to a folder (eval): ``out`` must be a folder or not exist yet."""
    target = absolute(out)
    _check_parents(target, flag, out)
    if target.exists() and not target.is_dir():
        raise ValueError(f"{flag} {out} is a file, not a folder; choose a folder for the results.")
    return target


def _check_parents(target: Path, flag: str, out) -> None:
    for parent in target.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ValueError(f"{flag} {out}: {parent} is a file, not a folder.")
            return


def write_folder(
    out: str | os.PathLike,
    write: Callable[[Path], None],
    overwrite: bool = False,
    source: str | None = None,
    flag: str = "--out",
) -> Path:
    """Check ``out``, call ``write(staging)`` on a new folder beside it, then rename that into place; all of it
    under ``out``'s lock, so that a second writer of the same folder is refused instead of replacing the first's."""
    target = check_folder_target(out, overwrite, source, flag)  # a bad target is named before the lock is taken
    with hold(target, "", lambda pid, by: busy_message(flag, out, pid, by)):
        clean_stale(target)  # a model folder a killed run moved aside comes back, and is checked
        check_folder_target(out, overwrite, source, flag)  # again: another writer may have finished meanwhile
        staging = new_name(target, STAGING)
        staging.mkdir()  # not mkdtemp: the folder gets the user's umask (0755), not 0700
        try:
            write(staging)
            _normal_permissions(staging)
            clean_stale(target)  # lock files nobody holds inside a folder being replaced
            swap_into_place(staging, target)
        finally:
            if staging.exists():
                shutil.rmtree(staging)
    return target


def busy_message(flag: str, out, pid: int | None, by: str | None) -> str:
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return (
        f"{flag} {out}: another posswap process ({who}{', ' + by if by else ''}) is writing that folder now; "
        "wait for it to finish, or choose another folder."
    )


def remove_model_folder(path: Path) -> None:
    """Remove a model folder posswap wrote; refuse anything that does not look like one."""
    if not path.exists():
        return
    if not is_model_folder(path):
        raise ValueError(f"{path} is not a model folder (no config.json); not removing it. Move it away and run again.")
    shutil.rmtree(path)


def _normal_permissions(folder: Path) -> None:
    """Files as an ordinary ``open`` would make them under the user's umask: some writers (safetensors via a
    temporary file) leave 0600 behind."""
    umask = os.umask(0)
    os.umask(umask)
    for path in [folder, *folder.rglob("*")]:
        if not path.is_symlink():
            executable = path.is_dir() or path.stat().st_mode & 0o111
            path.chmod((0o777 if executable else 0o666) & ~umask)


# A path of the machine that ran a command (a scratch folder, a home or a clone's own place), as results JSON records it.
MACHINE_PATH = re.compile(r"(?<![\w./-])/(?:tmp|work|home|root|scratch|mnt)/[^\s`'\";,)]*")
CLONE = Path(__file__).resolve().parents[1]


def shown_command(command: str) -> str:
    """``command`` as the docs show it, without the paths of the machine that ran it: one inside this clone relative
    to it, any other as ``out/NAME`` (a scratch output folder or file: the same run wherever it is made)."""

    def shown(match: re.Match) -> str:
        path = Path(match.group(0))
        try:
            return path.relative_to(CLONE).as_posix() or "."
        except ValueError:
            return f"out/{path.name}"

    # The clone itself can sit anywhere (a CI checkout under /check/...), which the pattern does not know.
    clone = rf"(?<![\w./-]){re.escape(CLONE.as_posix())}"
    command = re.sub(rf"{clone}(?![^\s/])", ".", re.sub(rf"{clone}/", "", command))
    return MACHINE_PATH.sub(shown, command)
