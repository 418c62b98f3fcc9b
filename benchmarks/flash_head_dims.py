"""Why TUPE's forward costs more than the stock model's on CPU: the kernel-level evidence.

    python benchmarks/flash_head_dims.py --threads 2 --out results/speed/tupe-flash-head-dims-2threads.json

TUPE adds its positional correlation ``(p_i U_Q).(p_j U_K)`` as extra query / key features (``[q | pq]``,
``[k | pk]``, ``portable/posswap_tupe.py``): the queries and keys of a 32-dim head become 64 wide (66 with the
[CLS] reset). This measures, at 4096 tokens, batch 1, forward only:
  1. torch's CPU flash kernel (``_scaled_dot_product_flash_attention_for_cpu``) given queries / keys wider than the
     values: it refuses (the message is recorded), so ``F.scaled_dot_product_attention`` takes the math path;
  2. that math path's time (q, k 64 wide, v 32) against the flash kernel at 32;
  3. the flash kernel with every input 32 (stock), 64 (TUPE: v padded with zeros, what posswap runs) and 66
     (TUPE with the [CLS] reset): the padded value doubles the second product, so attention costs what a head
     twice as wide costs.
Shapes: the reference GPT-2 (8 heads, causal) and MiniLM (12 heads, bidirectional). Median of --repeats calls.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

from bench_methods import write_record  # this folder is on sys.path when the script runs

SHAPES = {"reference GPT-2 (8 heads, causal)": (8, True), "MiniLM (12 heads, bidirectional)": (12, False)}


def median_seconds(call, repeats: int) -> float:
    call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def shape_row(heads: int, causal: bool, length: int, repeats: int) -> dict:
    import torch
    import torch.nn.functional as F

    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
    inputs = {d: [torch.randn(1, heads, length, d) for _ in range(3)] for d in (32, 64, 66)}
    row = {}
    with torch.inference_mode():
        for d, (q, k, v) in inputs.items():
            row[f"flash_{d}"] = median_seconds(lambda q=q, k=k, v=v: flash(q, k, v, is_causal=causal), repeats)
        q, k, v = inputs[64][0], inputs[64][1], inputs[32][2]
        try:
            flash(q, k, v, is_causal=causal)
            row["flash_unequal_value"] = "accepted"
        except RuntimeError as error:
            row["flash_unequal_value"] = str(error).strip().splitlines()[0]
        sdpa = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal)  # noqa: E731
        row["sdpa_math_64_32"] = median_seconds(sdpa, max(1, repeats // 2))
    for key in ("flash_64", "flash_66", "sdpa_math_64_32"):
        row[f"{key}_vs_flash_32"] = row[key] / row["flash_32"]
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = {name: shape_row(*shape, args.length, args.repeats) for name, shape in SHAPES.items()}
    for name, row in rows.items():
        print(f"{name}: flash 32 {row['flash_32']:.3f} s, 64 {row['flash_64_vs_flash_32']:.2f}x, "
              f"66 {row['flash_66_vs_flash_32']:.2f}x, math path (64/32) {row['sdpa_math_64_32_vs_flash_32']:.1f}x; "
              f"flash with a narrower value: {row['flash_unequal_value']}")  # fmt: skip
    if args.out:
        fields = {"length": args.length, "threads": args.threads, "shapes": rows}
        write_record(args.out, "flash_head_dims.py", load_before, fields)


if __name__ == "__main__":
    main()
