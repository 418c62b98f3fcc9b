"""Tokens/s and peak memory of each posswap method against stock GPT-2, measured in the same run, as ratios.

    python benchmarks/bench_methods.py --size reference --lengths 256 512 1024 2048      # the study's table
    python benchmarks/bench_methods.py --size small --variants stock alibi-sdpa alibi-flex --lengths 512 4096

A GPT-2 config (--size reference: the study's 6 x 256, 8 heads, 8k vocabulary; small: GPT-2-small, 12 x 768;
--layers to shorten), random weights, batch 1, the bare transformer (GPT2Model: no LM head, whose cost would
hide the attention). Each patched variant starts from a table of length/4 positions (the study's 4x) and is
patched to the length; stock is GPT-2 with a learned table of the full length, i.e. what the same model
costs at that length without posswap. Variants:
  stock       GPT-2 with SDPA (is_causal, no mask tensor), learned table
  copy        interpolate (copy): the same compute as stock by construction, measured to show it
  rope        posswap RoPE (rotation in hooks on c_attn, table dropped); rope-yarn: YaRN factor 4
  alibi-sdpa  posswap ALiBi, bias added to SDPA's float mask
  alibi-flex  posswap ALiBi, bias in flex_attention's score_mod (torch.compile'd, compile time excluded);
              forward only on CPU: torch 2.13's flex_attention has no CPU backward
  sinusoidal  posswap's fixed sin/cos table in place of the learned one (a row lookup, as stock)
  nope        no positions at all (table dropped, nothing added)
  t5-bias     posswap t5-bias (32 buckets shared by the layers), bias added to SDPA's float mask
  tupe        posswap TUPE (sdpa): the positional correlation as extra q/k features, no n x n tensor
  tupe-dense  the alternative TUPE did not take: the same correlation as a dense (heads, n, n) bias in SDPA's mask
  tupe-r      TUPE-R (sdpa): features plus T5's bucketed relative bias (dense)
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

VARIANTS = (
    "stock",
    "copy",
    "rope",
    "rope-yarn",
    "alibi-sdpa",
    "alibi-flex",
    "sinusoidal",
    "nope",
    "t5-bias",
    "tupe",
    "tupe-dense",
    "tupe-r",
)
SIZES = {
    "reference": dict(n_layer=6, n_embd=256, n_head=8, vocab_size=8192),
    "small": dict(n_layer=12, n_embd=768, n_head=12),
}
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


def patch_config(variant: str, length: int):
    import posswap

    return {
        "copy": posswap.InterpolateConfig(max_length=length, mode="copy"),
        "rope": posswap.RopeConfig(max_length=length),
        "rope-yarn": posswap.RopeConfig(max_length=length, scaling="yarn", factor=4.0),
        "alibi-sdpa": posswap.AlibiConfig(max_length=length, backend="sdpa"),
        "alibi-flex": posswap.AlibiConfig(max_length=length, backend="flex"),
        "sinusoidal": posswap.SinusoidalConfig(max_length=length),
        "nope": posswap.NoPEConfig(max_length=length),
        "t5-bias": posswap.T5BiasConfig(max_length=length, backend="sdpa"),
        "tupe": posswap.TupeConfig(max_length=length, backend="sdpa"),
        "tupe-dense": posswap.TupeConfig(max_length=length, backend="sdpa"),
        "tupe-r": posswap.TupeConfig(max_length=length, backend="sdpa", relative=True),
    }[variant]


def as_dense_bias(model) -> None:
    """tupe-dense: the provider gives its correlation as a dense bias instead of q/k features."""
    provider = model.base_model.posswap_bias_providers[0]
    features = provider.features  # bound before it is replaced: scaling 1.0 gives the term itself

    def bias(q_pos, k_pos):
        fq, fk = features(q_pos, k_pos, 1.0)
        return fq @ fk.transpose(-1, -2)  # (1, heads, q, k)

    provider.has_bias, provider.bias, provider.features = True, bias, lambda *args: None


def measure(variant: str, length: int, mode: str, size: str, layers: int | None, repeats: int, device: str) -> dict:
    import torch
    import transformers

    import posswap

    torch.manual_seed(0)
    shape = {**SIZES[size], **({"n_layer": layers} if layers else {})}
    original = length if variant == "stock" else length // 4
    config = transformers.GPT2Config(**shape, n_positions=original, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
    model = transformers.GPT2Model(config).to(device)
    if variant != "stock":
        posswap.patch(model, patch_config(variant, length))
    if variant == "tupe-dense":
        as_dense_bias(model)
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
    return {"time": statistics.median(times), "peak": peak, "tokens_per_s": length / statistics.median(times)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[512, 1024, 2048, 4096])
    parser.add_argument("--size", choices=sorted(SIZES), default="reference")
    parser.add_argument("--layers", type=int, default=None, help="Fewer layers than the size has (shorter runs).")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:  # child process: one configuration
        variant, length, mode = args._one.split(",")
        print(json.dumps(measure(variant, int(length), mode, args.size, args.layers, args.repeats, args.device)))
        return

    results = {}
    for length in args.lengths:
        for mode in MODES:
            for variant in args.variants:
                if variant == "alibi-flex" and mode == "fwd+bwd" and args.device == "cpu":
                    continue  # torch 2.13: "FlexAttention does not support backward on CPU"
                command = [
                    sys.executable,
                    __file__,
                    "--_one",
                    f"{variant},{length},{mode}",
                    "--size",
                    args.size,
                    "--repeats",
                    str(args.repeats),
                    "--device",
                    args.device,
                ] + (["--layers", str(args.layers)] if args.layers else [])
                # Large blocks via mmap: freed memory goes back to the OS, so RSS follows live tensors.
                env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
                done = subprocess.run(command, capture_output=True, text=True, env=env)
                if done.returncode != 0:
                    print(f"{variant} {length} {mode} failed:\n{done.stderr[-2000:]}", file=sys.stderr)
                    continue
                results[variant, length, mode] = json.loads(done.stdout.strip().splitlines()[-1])
                r = results[variant, length, mode]
                print(
                    f"  {variant:10s} {length:6d} {mode:8s} {r['time']:8.3f} s  {r['peak'] / 2**20:9.1f} MiB",
                    file=sys.stderr,
                    flush=True,
                )

    mib = 2**20
    shape = {**SIZES[args.size], **({"n_layer": args.layers} if args.layers else {})}
    print(
        f"\nGPT-2 {args.size} ({shape}), GPT2Model, batch 1, {args.device}, median of {args.repeats}; "
        f"memory = {'CUDA max_memory_allocated' if args.device == 'cuda' else 'peak RSS delta'} during the call"
    )
    print("| length | pass | variant | tokens/s | peak MiB | speed / stock | memory / stock |")
    print("|---|---|---|---|---|---|---|")
    for length in args.lengths:
        for mode in MODES:
            stock = results.get(("stock", length, mode))
            for variant in args.variants:
                r = results.get((variant, length, mode))
                if r is None:
                    continue
                speed = f"{stock['time'] / r['time']:.2f}" if stock else "-"
                memory = f"{r['peak'] / stock['peak']:.2f}" if stock and stock["peak"] > 0 else "-"
                print(
                    f"| {length} | {mode} | {variant} | {length / r['time']:,.0f} | {r['peak'] / mib:.1f} | {speed} | {memory} |"
                )


if __name__ == "__main__":
    main()
