"""Where a 2048-token document's time goes in the torch model and in its ONNX graph, and how close each kernel runs
to the machine's arithmetic peak: the evidence for what the float graph can and cannot gain over torch.

    python benchmarks/onnx_kernel_rates.py OUT_ONNX TORCH_FOLDER --threads 2 \
        --out results/speed/onnx-kernels-2threads.json

OUT_ONNX is ``posswap export TORCH_FOLDER --format onnx [--int8]``'s folder. One batch of ``--docs`` documents of
``--tokens`` random word pieces; each engine's per-operator time from its own profiler (torch.profiler, onnxruntime's
``enable_profiling``), summed over ``--repeats`` runs after a warm-up and divided by them. Rates: the multiply-adds of
the projections and feed-forward (``linear``) and of attention's two products (``attention``), x 2 flops, over the
seconds of the operators that do them (torch: addmm and the flash kernel; onnxruntime: MatMul / MatMulInteger and
MultiHeadAttention).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

TORCH_KERNELS = {
    "linear": ("aten::addmm", "aten::mm"),
    "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu",),
}
ORT_KERNELS = {"linear": ("MatMul", "MatMulInteger", "DynamicQuantizeMatMul", "MatMulIntegerToFloat"),
               "attention": ("MultiHeadAttention",)}  # fmt: skip


def flops(config, docs: int, tokens: int) -> dict[str, float]:
    """Multiply-adds x 2 of one forward: four d x d projections and the d x 4d x d feed-forward per token and
    layer; q.k and attention.v per head, query and key."""
    d, layers, ff = config.hidden_size, config.num_hidden_layers, config.intermediate_size
    linear = 2 * docs * tokens * (4 * d * d + 2 * d * ff) * layers
    attention = 2 * 2 * docs * tokens * tokens * d * layers
    return {"linear": float(linear), "attention": float(attention)}


def torch_times(folder: str, ids: np.ndarray, repeats: int) -> tuple[float, dict[str, float]]:
    from torch.profiler import ProfilerActivity, profile

    import posswap

    model = posswap.from_pretrained(folder, device="cpu")[0].auto_model.eval()
    feed = {"input_ids": torch.from_numpy(ids), "attention_mask": torch.ones(ids.shape, dtype=torch.long)}
    feed["token_type_ids"] = torch.zeros_like(feed["input_ids"])
    with torch.inference_mode():
        model(**feed)
        start = time.perf_counter()
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(repeats):
                model(**feed)
        wall = (time.perf_counter() - start) / repeats
    by_op = {e.key: e.self_cpu_time_total / 1e6 / repeats for e in prof.key_averages()}
    return wall, {kind: sum(by_op.get(op, 0.0) for op in ops) for kind, ops in TORCH_KERNELS.items()}


def ort_times(graph: Path, ids: np.ndarray, repeats: int, threads: int) -> tuple[float, dict[str, float]]:
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    options.profile_file_prefix = str(Path(tempfile.mkdtemp()) / "ort")  # not beside the user's files
    session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
    feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
    feed = {i.name: feed[i.name] for i in session.get_inputs()}
    session.run(None, feed)  # warm-up: profiled too, so the sums below hold one run more
    start = time.perf_counter()
    for _ in range(repeats):
        session.run(None, feed)
    wall = (time.perf_counter() - start) / repeats
    by_op, profile = collections.Counter(), Path(session.end_profiling())
    events = json.loads(profile.read_text())
    shutil.rmtree(profile.parent)
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"] / 1e6
    runs = repeats + 1  # the warm-up is profiled too: the mean over every run
    return wall, {kind: sum(by_op[op] for op in ops) / runs for kind, ops in ORT_KERNELS.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx_folder", type=Path)
    parser.add_argument("torch_folder")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--docs", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=2040)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(args.onnx_folder)
    ids = np.random.default_rng(0).integers(1000, config.vocab_size, (args.docs, args.tokens))
    work = flops(config, args.docs, args.tokens)
    load = os.getloadavg()
    engines = {"torch": torch_times(args.torch_folder, ids, args.repeats)}
    for graph in sorted((args.onnx_folder / "onnx").glob("*.onnx")):
        engines[f"onnxruntime {graph.name}"] = ort_times(graph, ids, args.repeats, args.threads)
    rows = {}
    for name, (wall, kernels) in engines.items():
        rows[name] = {"seconds": round(wall, 4), "kernels": {}}
        for kind, seconds in kernels.items():
            rate = work[kind] / seconds / 1e9 if seconds else None
            rows[name]["kernels"][kind] = {"seconds": round(seconds, 4), "gflops": rate and round(rate, 1)}
        print(f"{name:34s} {wall:6.3f} s  " + "  ".join(
            f"{k} {v['seconds']:.3f} s ({v['gflops']} GFLOP/s)" for k, v in rows[name]["kernels"].items()))  # fmt: skip
    if args.out:
        record = {
            "command": "python benchmarks/onnx_kernel_rates.py " + " ".join(sys.argv[1:]),
            "threads": args.threads, "docs": args.docs, "tokens": args.tokens, "repeats": args.repeats,
            "flops": work, "machine": platform.processor() or platform.machine(), "torch": torch.__version__,
            "load_average": {"before": list(load), "after": list(os.getloadavg())}, "engines": rows,
        }  # fmt: skip
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
