"""Time and peak memory of ALiBi-patched GPT-2 against stock GPT-2, measured in the same run.

    python benchmarks/bench_alibi.py [--lengths 512 1024 2048 4096] [--layers 12] [--repeats 2] [--device cpu]

A GPT-2-small-like config (12 heads, 768 wide; --layers to shorten the run), random weights, batch 1, the
bare transformer (GPT2Model: no LM head, whose cost would hide the attention). Variants:
  stock       GPT-2 with SDPA (is_causal, no mask tensor), learned table
  alibi-sdpa  posswap ALiBi, bias added to SDPA's float mask
  alibi-flex  posswap ALiBi, bias in flex_attention's score_mod (torch.compile'd, compile time excluded);
              forward only on CPU: torch 2.13's flex_attention has no CPU backward
Each (variant, length, mode) runs in its own subprocess. Peak memory: on CUDA torch.cuda.max_memory_allocated;
on CPU the peak resident set size (a sampling thread reading /proc/self/statm every 0.5 ms) during the
measured call, minus the RSS just before it, with MALLOC_MMAP_THRESHOLD_=65536 so that freed tensors leave RSS. Time: the median of --repeats calls after one warm-up.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

VARIANTS = ("stock", "alibi-sdpa", "alibi-flex")
MODES = ("fwd", "fwd+bwd")


def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


class PeakRss:
    def __enter__(self):
        self.start = self.peak = _rss()
        self.running = True
        self.thread = threading.Thread(target=self._watch, daemon=True)
        self.thread.start()
        return self

    def _watch(self):
        while self.running:
            self.peak = max(self.peak, _rss())
            time.sleep(0.0005)

    def __exit__(self, *exc):
        self.running = False
        self.thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def delta(self) -> int:
        return self.peak - self.start


def measure(variant: str, length: int, mode: str, layers: int, repeats: int, device: str) -> dict:
    import torch
    import transformers

    import posswap

    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=layers, n_embd=768, n_head=12, n_positions=length, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = transformers.GPT2Model(config).to(device)
    if variant != "stock":
        posswap.patch(model, posswap.AlibiConfig(max_length=length, backend=variant.split("-")[1]))
    model.train(mode == "fwd+bwd")
    ids = torch.randint(0, config.vocab_size, (1, length), device=device)

    def step():
        if mode == "fwd":
            with torch.no_grad():
                model(input_ids=ids)
        else:
            model(input_ids=ids).last_hidden_state.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    step()  # warm-up (and flex compilation)
    times = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        with PeakRss() as rss:
            step()
        times.append(time.perf_counter() - start)
        peak = torch.cuda.max_memory_allocated() - base if device == "cuda" else rss.delta
    return {"time": statistics.median(times), "peak": peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:  # child process: one configuration
        variant, length, mode = args._one.split(",")
        print(json.dumps(measure(variant, int(length), mode, args.layers, args.repeats, args.device)))
        return

    results = {}
    for length in args.lengths:
        for mode in MODES:
            for variant in args.variants:
                if variant == "alibi-flex" and mode == "fwd+bwd" and args.device == "cpu":
                    continue  # torch 2.13: "FlexAttention does not support backward on CPU"
                command = [sys.executable, __file__, "--_one", f"{variant},{length},{mode}", "--layers", str(args.layers),
                           "--repeats", str(args.repeats), "--device", args.device]
                # Large blocks via mmap: freed memory goes back to the OS, so RSS follows live tensors.
                env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    print(f"{variant} {length} {mode} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                results[variant, length, mode] = json.loads(done.stdout.strip().splitlines()[-1])
                r = results[variant, length, mode]
                print(f"  {variant:10s} {length:6d} {mode:8s} {r['time']:8.3f} s  {r['peak'] / 2**20:9.1f} MiB", file=sys.stderr, flush=True)

    mib = 2**20
    print(f"\nGPT-2-small-like ({args.layers} layers, 12 heads, 768), batch 1, {args.device}, median of {args.repeats}; "
          f"memory = {'CUDA max_memory_allocated' if args.device == 'cuda' else 'peak RSS delta'}")
    print(f"{'length':>6} {'mode':8} {'variant':10} {'time s':>8} {'peak MiB':>9} {'time/stock':>10} {'mem/stock':>9}")
    for length in args.lengths:
        for mode in MODES:
            stock = results.get(("stock", length, mode))
            for variant in args.variants:
                r = results.get((variant, length, mode))
                if r is None:
                    continue
                t_ratio = f"{r['time'] / stock['time']:.2f}" if stock else "-"
                m_ratio = f"{r['peak'] / stock['peak']:.2f}" if stock and stock["peak"] > 0 else "-"
                print(f"{length:6d} {mode:8} {variant:10} {r['time']:8.3f} {r['peak'] / mib:9.1f} {t_ratio:>10} {m_ratio:>9}")


if __name__ == "__main__":
    main()
