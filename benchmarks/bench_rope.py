"""Speed and peak memory of a RoPE-patched GPT-2 against the stock model, in one run, as ratios.

    python benchmarks/bench_rope.py --lengths 256 512 1024 --repeats 3
    python benchmarks/bench_rope.py --interleaved --lengths 256 512 1024   # time only, one process

Default: each (model, length, pass) runs in its own subprocess so that its peak RSS (ru_maxrss) is its own;
on a GPU the peak comes from torch.cuda.max_memory_allocated. --interleaved builds both models in one
process and alternates them call by call (forward+backward), which cancels most machine noise: use it for
the time ratio.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


def build(kind: str, length: int, device: str):
    import transformers

    import posswap

    config = transformers.GPT2Config(
        n_layer=12, n_embd=768, n_head=12, n_positions=max(length, 1024), attn_pdrop=0, resid_pdrop=0, embd_pdrop=0
    )
    torch.manual_seed(0)
    model = transformers.GPT2LMHeadModel(config).to(device)
    if kind == "rope":
        posswap.patch(model, posswap.RopeConfig(max_length=max(length, 1024)))
    return model


def measure(kind: str, length: int, mode: str, repeats: int, device: str) -> dict:
    model = build(kind, length, device)
    ids = torch.randint(0, 50257, (1, length), device=device)
    model.train(mode == "fwd+bwd")

    def step():
        if mode == "fwd":
            with torch.no_grad():
                model(input_ids=ids)
        else:
            model(input_ids=ids, labels=ids).loss.backward()
            model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    peak = (
        torch.cuda.max_memory_allocated()
        if device == "cuda"
        else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    )
    return {"seconds": min(times), "peak_bytes": peak}


def interleaved(lengths: list[int], repeats: int, device: str) -> None:
    models = {kind: build(kind, max(lengths), device).train() for kind in ("stock", "rope")}
    print(f"GPT-2-small config, forward+backward, batch 1, device {device}, interleaved, best of {repeats}")
    for length in lengths:
        ids = torch.randint(0, 50257, (1, length), device=device)
        times = {kind: [] for kind in models}
        for _ in range(repeats + 1):  # the first round warms up
            for kind, model in models.items():
                start = time.perf_counter()
                model(input_ids=ids, labels=ids).loss.backward()
                model.zero_grad(set_to_none=True)
                if device == "cuda":
                    torch.cuda.synchronize()
                times[kind].append(time.perf_counter() - start)
        stock, rope = min(times["stock"][1:]), min(times["rope"][1:])
        print(f"{length:>6}: stock {stock:.3f} s, rope {rope:.3f} s, ratio {rope / stock:.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", nargs="+", action="extend", type=int, default=None)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument(
        "--interleaved", action="store_true", help="Time only: both models in one process, alternating."
    )
    parser.add_argument("--child", nargs=3, metavar=("KIND", "LENGTH", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, length, mode = args.child
        print(json.dumps(measure(kind, int(length), mode, args.repeats, args.device)))
        return

    if args.interleaved:
        interleaved(args.lengths or [256, 512, 1024], args.repeats, args.device)
        return
    print(f"GPT-2-small config (12 x 768, 12 heads), batch 1, device {args.device}, best of {args.repeats}")
    print(
        f"{'length':>7} {'pass':>8} {'stock s':>9} {'rope s':>9} {'time ratio':>11} {'stock MiB':>10} {'rope MiB':>9} {'mem ratio':>10}"
    )
    for length in args.lengths or [256, 512, 1024]:
        for mode in ("fwd", "fwd+bwd"):
            result = {}
            for kind in ("stock", "rope"):
                command = [
                    sys.executable,
                    __file__,
                    "--child",
                    kind,
                    str(length),
                    mode,
                    "--repeats",
                    str(args.repeats),
                    "--device",
                    args.device,
                ]
                result[kind] = json.loads(
                    subprocess.run(command, check=True, capture_output=True, text=True).stdout.strip().splitlines()[-1]
                )
            s, r = result["stock"], result["rope"]
            print(
                f"{length:>7} {mode:>8} {s['seconds']:>9.3f} {r['seconds']:>9.3f} {r['seconds'] / s['seconds']:>10.3f}x "
                f"{s['peak_bytes'] / 2**20:>10.0f} {r['peak_bytes'] / 2**20:>9.0f} {r['peak_bytes'] / s['peak_bytes']:>9.3f}x",
                flush=True,
            )


if __name__ == "__main__":
    main()
