"""Output folders without data loss: a target is checked before anything is written, the new folder is
staged beside it and renamed into place, and only a model folder (one with ``config.json``) is ever replaced.

Staging folders are named ``.NAME.posswap-staging-PID-XXXX`` (and ``.NAME.posswap-old-PID-XXXX`` for the
folder being replaced), so a run that was killed half-way leaves names the next write to NAME recognises.
"""

from __future__ import annotations

import os
import re
import secrets
import shutil
from pathlib import Path
from typing import Callable

STAGING, RETIRED = "posswap-staging", "posswap-old"
_OURS = re.compile(rf"^\.(?P<name>.+)\.(?P<kind>{STAGING}|{RETIRED})-(?P<pid>\d+)-[0-9a-f]+$")


def absolute(path: str | os.PathLike) -> Path:
    """``.`` and ``out/..`` made absolute without following links, so the target always has a name."""
    return Path(os.path.abspath(os.path.expanduser(str(path))))


def is_model_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and (path / "config.json").is_file()


def check_folder_target(out: str | os.PathLike, overwrite: bool = False, source: str | None = None, flag: str = "--out") -> Path:
    """Raise ``ValueError`` unless ``out`` may be written: absent or an empty folder, or (with ``overwrite``)
    a model folder that does not hold ``source``, the model being read. Returns ``out`` made absolute."""
    target = absolute(out)
    if target.parent == target:
        raise ValueError(f"{flag} {out}: cannot write a model to the root of the file system; name a folder.")
    _check_parents(target, flag, out)
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise ValueError(f"{flag} {out} exists and is not a folder (a file or a link); choose a new folder.")
    if not target.exists() or not any(target.iterdir()):
        return target
    if not overwrite:
        raise ValueError(
            f"{flag} {out} already exists and is not empty: choose a new folder, or pass --overwrite to replace "
            "a model folder written earlier."
        )
    if not (target / "config.json").is_file():
        raise ValueError(f"{flag} {out} is not a model folder (no config.json), so --overwrite does not replace it; choose a new folder.")
    if source is not None and os.path.exists(source):
        real_source, real_target = Path(os.path.realpath(source)), Path(os.path.realpath(target))
        if real_source == real_target or real_target in real_source.parents:
            raise ValueError(f"{flag} {out} holds the model being read ({source}); write the result to another folder.")
    return target


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


def write_folder(out: str | os.PathLike, write: Callable[[Path], None], overwrite: bool = False, source: str | None = None, flag: str = "--out") -> Path:
    """Check ``out``, call ``write(staging)`` on a new folder beside it, then rename that into place."""
    clean_stale(absolute(out))  # first: a model folder a killed run moved aside comes back, and is checked
    target = check_folder_target(out, overwrite, source, flag)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = _new_name(target, STAGING)
    staging.mkdir()  # not mkdtemp: the folder gets the user's umask (0755), not 0700
    try:
        write(staging)
        _normal_permissions(staging)
        if target.exists() and any(target.iterdir()):  # a model folder that check_folder_target allowed
            retired = _new_name(target, RETIRED)
            os.replace(target, retired)
            os.replace(staging, target)
            shutil.rmtree(retired)
        else:
            os.replace(staging, target)  # rename(2) replaces an empty folder
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return target


def clean_stale(target: Path) -> None:
    """Remove what a killed write to ``target`` left: its staging folder, and the replaced model folder
    (put back if the new one never arrived). Folders of writes that are still running are left alone."""
    if target.is_symlink() or not target.parent.is_dir():
        return
    for path in target.parent.iterdir():
        match = _OURS.match(path.name)
        if not match or match["name"] != target.name or _running(int(match["pid"])):
            continue
        if match["kind"] == RETIRED and not (target.exists() and any(target.iterdir())):
            os.replace(path, target)
        else:
            shutil.rmtree(path, ignore_errors=True)


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


def _new_name(target: Path, kind: str) -> Path:
    return target.parent / f".{target.name}.{kind}-{os.getpid()}-{secrets.token_hex(4)}"


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's live process
    return True
