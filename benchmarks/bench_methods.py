"""Time and peak memory of each posswap method against the stock model, measured in the same process, interleaved.

    python benchmarks/bench_methods.py --size reference --lengths 2048 4096 --repeats 5 --out results/speed/gpt2-reference.json
    python benchmarks/bench_methods.py --size minilm --lengths 2048 4096 --repeats 5 --out results/speed/minilm.json
    python benchmarks/bench_methods.py --size small --variants stock alibi alibi-flex --lengths 512 4096

Sizes: reference (the study's GPT-2: 6 x 256, 8 heads, 8k vocabulary), small (GPT-2-small, 12 x 768), minilm (a
BERT the shape of all-MiniLM-L6-v2: 6 x 384, 12 heads: the encoder where the bias is symmetric); --layers to
shorten. Random weights, batch 1, the bare transformer (GPT2Model / BertModel: no head, whose cost would hide the
attention). Each patched variant starts from a table of length/4 positions (the study's 4x) and is patched to the
length; stock is the same model with a learned table of the full length, i.e. what it costs at that length
without posswap. Variants: stock, then one per method registered (``posswap.registry.registered()``, so a new
method is measured by being registered), its config with every default at the length, then a few more of some:
  stock         the model with SDPA (GPT-2: is_causal, no mask tensor), learned table
  <method>      the method's default config: interpolate copies (the same compute as stock by construction,
                measured to show it), the biases (alibi, t5-bias, tupe's features) run through SDPA, blocked on
                CPU: inference portable/posswap_blocked.py, training portable/posswap_blocked_grad.py
  rope-yarn     RoPE with YaRN, factor 4
  alibi-dense, t5-bias-dense, tupe-dense   the dense (heads, n, n) bias forced (the path before the blocked one; for
                TUPE the alternative it did not take: its correlation as a dense bias in SDPA's mask)
  alibi-flex    ALiBi's bias in flex_attention's score_mod (torch.compile'd, compile time excluded) on a GPU; on CPU
                backend="flex" runs the sdpa path (portable/posswap_flex_route.py), so this variant measures alibi there
  tupe-r        TUPE-R: features plus T5's bucketed relative bias (blocked on CPU)
Committed runs before the registry named the defaults copy, alibi-sdpa and the like (results/speed/).
One process per (length, pass) holds every variant's model; each round calls every variant once (the order
rotating by one each round), so a noisy neighbour slows all variants alike, and the ratios to stock are taken
from the same rounds. Time: median of --repeats rounds after one warm-up call each, with the default allocator
(what a user runs) and nothing else running in the process. Peak memory: on CUDA torch.cuda.max_memory_allocated,
in the same rounds; on CPU a second process per (length, pass) measures it alone: the peak resident set size (a
sampling thread reading /proc/self/statm every 0.5 ms) during the call minus the RSS just before it, with
MALLOC_MMAP_THRESHOLD_=65536 so that freed tensors leave RSS; the median over --memory-repeats rounds. (That
allocator setting makes every large tensor a fresh mmap whose pages fault in. One child, --_one 4096,fwd+bwd,time
--threads 1 --variants stock t5-bias alibi-sdpa t5-bias-dense, run with and without it in one session: stock 1.20x,
t5-bias 1.44x slower under it, t5-bias-dense 0.84x; so t5-bias read 1.24x stock instead of 1.03x and the dense bias
3.83x instead of 5.48x. Hence time and memory are separate processes.)
--out writes every figure and the command to a JSON file.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

# The variants besides each registered method's defaults: variant -> (its method, the config's keys besides the length).
EXTRA = {
    "rope-yarn": ("rope", {"rope_type": "yarn", "factor": 4.0}),
    "alibi-dense": ("alibi", {}),
    "alibi-flex": ("alibi", {"backend": "flex"}),
    "t5-bias-dense": ("t5-bias", {}),
    "tupe-dense": ("tupe", {}),
    "tupe-r": ("tupe", {"relative": True}),
}


def variants() -> tuple[str, ...]:
    """stock, every registered method, then the extra variants of the methods registered."""
    from posswap.registry import registered

    methods = tuple(registered())
    return ("stock", *methods, *(name for name, (method, _) in EXTRA.items() if method in methods))


VARIANTS = variants()
SIZES = {
    "reference": dict(n_layer=6, n_embd=256, n_head=8, vocab_size=8192),
    "small": dict(n_layer=12, n_embd=768, n_head=12),
    "minilm": dict(num_hidden_layers=6, hidden_size=384, num_attention_heads=12, intermediate_size=1536),
}
ENCODERS = {"minilm"}
MODES = ("fwd", "fwd+bwd")
DENSE = {"alibi-dense", "t5-bias-dense", "tupe-dense"}  # run with the dense bias forced


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
    """The config a variant patches with: its method's config class (from the registry), every default but ``keys``."""
    from posswap.registry import registered

    method, keys = EXTRA.get(variant, (variant, {}))
    return registered()[method].config_class(max_length=length, **keys)


def as_dense_bias(model) -> None:
    """tupe-dense: the provider gives its correlation as a dense bias instead of q/k features."""
    provider = model.base_model.posswap_bias_providers[0]
    features = provider.features  # bound before it is replaced: scaling 1.0 gives the term itself

    def bias(q_pos, k_pos):
        fq, fk = features(q_pos, k_pos, 1.0)
        return fq @ fk.transpose(-1, -2)  # (1, heads, q, k)

    provider.has_bias, provider.has_features, provider.bias = True, False, bias


def build(variant: str, length: int, size: str, layers: int | None, device: str):
    """The bare model of ``size`` for ``variant`` at ``length`` (random weights, seed 0, no dropout)."""
    import torch
    import transformers

    import posswap

    torch.manual_seed(0)
    original = length if variant == "stock" else length // 4
    if size in ENCODERS:
        shape = {**SIZES[size], **({"num_hidden_layers": layers} if layers else {})}
        config = transformers.BertConfig(
            **shape, max_position_embeddings=original, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
    else:
        shape = {**SIZES[size], **({"n_layer": layers} if layers else {})}
        config = transformers.GPT2Config(**shape, n_positions=original, attn_pdrop=0.0, resid_pdrop=0.0, embd_pdrop=0.0)
        model = transformers.GPT2Model(config)
    model = model.to(device)
    if variant != "stock":
        posswap.patch(model, patch_config(variant, length))
    if variant == "tupe-dense":
        as_dense_bias(model)
    return model


def step_function(model, variant: str, length: int, mode: str, device: str):
    """One measured call: forward under no_grad, or forward and backward; the dense variants force the dense bias."""
    import torch

    from posswap.portable import posswap_blocked

    model.train(mode == "fwd+bwd")
    vocab = model.config.vocab_size
    ids = torch.randint(0, vocab, (1, length), device=device, generator=torch.Generator(device).manual_seed(1))

    def call():
        if mode == "fwd":
            with torch.no_grad():
                model(input_ids=ids)
        else:
            model(input_ids=ids).last_hidden_state.float().pow(2).mean().backward()
            model.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()

    def step():
        saved = posswap_blocked.BLOCK_BYTES
        if variant in DENSE:
            posswap_blocked.BLOCK_BYTES = 2**62  # never blocked: the dense (heads, n, n) bias
        try:
            call()
        finally:
            posswap_blocked.BLOCK_BYTES = saved

    return step


def allocator_env(memory: bool) -> dict[str, str]:
    """This environment for a measuring process: the default allocator to time (what a user runs); to measure
    memory, large blocks via mmap (MALLOC_MMAP_THRESHOLD_=65536), so freed memory leaves RSS and RSS follows live
    tensors."""
    env = {k: v for k, v in os.environ.items() if k != "MALLOC_MMAP_THRESHOLD_"}
    return {**env, "MALLOC_MMAP_THRESHOLD_": "65536"} if memory else env


def timed(step, device: str, watch_rss: bool) -> tuple[float, int]:
    """Seconds of one call, and its peak memory (CUDA always; CPU RSS only when watch_rss: the sampler costs time)."""
    import torch

    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        start = time.perf_counter()
        step()  # synchronises
        return time.perf_counter() - start, torch.cuda.max_memory_allocated() - base
    if not watch_rss:
        start = time.perf_counter()
        step()
        return time.perf_counter() - start, 0
    start = time.perf_counter()
    with PeakRss() as rss:
        step()
    return time.perf_counter() - start, rss.delta


def measure_all(variants: list[str], length: int, mode: str, what: str, args) -> dict:
    """Every variant's model in this process; rounds of one call each, the order rotating; medians.

    what: "time" (CPU: no RSS sampler), "memory" (CPU: the RSS sampler, --memory-repeats rounds) or "both" (CUDA)."""
    steps = {}
    for variant in variants:
        model = build(variant, length, args.size, args.layers, args.device)
        steps[variant] = step_function(model, variant, length, mode, args.device)
        steps[variant]()  # warm-up (and flex compilation)
    times = {v: [] for v in variants}
    peaks = {v: [] for v in variants}
    for round_ in range(args.memory_repeats if what == "memory" else args.repeats):
        order = variants[round_ % len(variants) :] + variants[: round_ % len(variants)]
        for variant in order:
            seconds, peak = timed(steps[variant], args.device, watch_rss=what == "memory")
            times[variant].append(seconds)
            peaks[variant].append(peak)
    return {
        v: {
            "time": statistics.median(times[v]),
            "peak": statistics.median(peaks[v]),
            "times": times[v],
            "peaks": peaks[v],
            "tokens_per_s": length / statistics.median(times[v]),
        }
        for v in variants
    }


def run_child(variants: list[str], length: int, mode: str, what: str, args) -> dict | None:
    command = [sys.executable, __file__, "--_one", f"{length},{mode},{what}", "--variants", *variants]
    command += ["--size", args.size, "--repeats", str(args.repeats), "--device", args.device]
    command += ["--memory-repeats", str(args.memory_repeats)]
    command += ["--layers", str(args.layers)] if args.layers else []
    command += ["--threads", str(args.threads)] if args.threads else []
    done = subprocess.run(command, capture_output=True, text=True, env=allocator_env(memory=what == "memory"))
    if done.returncode != 0:
        print(f"{length} {mode} ({what}) failed:\n{done.stderr[-3000:]}", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(variants: list[str], length: int, mode: str, args) -> dict | None:
    """Time and peak memory of every variant at (length, pass): on CPU from two processes (see the docstring)."""
    if args.device == "cuda":
        return run_child(variants, length, mode, "both", args)
    timing = run_child(variants, length, mode, "time", args)
    memory = run_child(variants, length, mode, "memory", args)
    if timing is None or memory is None:
        return None
    for variant, figures in timing.items():
        figures["peak"], figures["peaks"] = memory[variant]["peak"], memory[variant]["peaks"]
    return timing


def ratios(results: dict) -> list[dict]:
    """Rows for the table and the JSON: each variant against stock of the same length and pass."""
    rows = []
    for (length, mode), by_variant in results.items():
        stock = by_variant.get("stock")
        for variant, r in by_variant.items():
            row = {"length": length, "pass": mode, "variant": variant, **r}
            if stock:
                row["time_vs_stock"] = r["time"] / stock["time"]
                # the same rounds paired: each round's time over stock's in that round, the median of those
                row["time_vs_stock_paired"] = statistics.median(t / s for t, s in zip(r["times"], stock["times"]))
                row["memory_vs_stock"] = r["peak"] / stock["peak"] if stock["peak"] > 0 else None
            rows.append(row)
    return rows


def write_record(path: Path, script: str, load_before, fields: dict) -> None:
    """A benchmark's figures (``fields``) with what made them: its command, torch, the machine and the load average
    before and now; written whole or not at all (staged, then renamed)."""
    import platform

    import torch

    record = {
        "command": f"python benchmarks/{script} " + " ".join(sys.argv[1:]),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        **fields,
        "load_average": {"before": load_before, "after": os.getloadavg()},
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    staging.replace(path)


def recompute(path: Path) -> None:
    """--recompute: the ratios of a JSON this script wrote, from its per-round figures (older files had fewer)."""
    record = json.loads(path.read_text())
    results = {}
    for row in record["rows"]:
        figures = {k: row[k] for k in ("time", "peak", "times", "peaks", "tokens_per_s")}
        results.setdefault((row["length"], row["pass"]), {})[row["variant"]] = figures
    record["rows"] = ratios(results)
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    staging.replace(path)


def print_table(rows: list[dict], args) -> None:
    mib = 2**20
    memory = "CUDA max_memory_allocated" if args.device == "cuda" else "peak RSS delta"
    threads = f", {args.threads} thread(s)" if args.threads else ""
    print(
        f"\n{args.size} ({model_shape(args)}), batch 1, {args.device}{threads}, median of {args.repeats}; memory = {memory}"
    )
    print("| length | pass | variant | tokens/s | peak MiB | time / stock | same rounds | memory / stock |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        time_ratio = f"{r['time_vs_stock']:.2f}" if "time_vs_stock" in r else "-"
        paired = f"{r['time_vs_stock_paired']:.2f}" if "time_vs_stock_paired" in r else "-"
        memory_ratio = f"{r['memory_vs_stock']:.2f}" if r.get("memory_vs_stock") is not None else "-"
        print(
            f"| {r['length']} | {r['pass']} | {r['variant']} | {r['tokens_per_s']:,.0f} | {r['peak'] / mib:.1f} "
            f"| {time_ratio} | {paired} | {memory_ratio} |"
        )


def model_shape(args) -> dict:
    layers_key = "num_hidden_layers" if args.size in ENCODERS else "n_layer"
    return {**SIZES[args.size], **({layers_key: args.layers} if args.layers else {})}


def write_json(path: Path, rows: list[dict], args) -> None:
    import torch

    record = {
        "command": "python benchmarks/bench_methods.py " + " ".join(sys.argv[1:]),
        "size": args.size,
        "model": ("BertModel" if args.size in ENCODERS else "GPT2Model") + f" {model_shape(args)}, random weights",
        "device": args.device,
        **({"gpu": torch.cuda.get_device_name(args.device)} if args.device.startswith("cuda") else {}),
        "threads": args.threads or torch.get_num_threads(),
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "repeats": args.repeats,
        "note": "time and memory are medians over rounds in one process per (length, pass), variants interleaved; "
        "ratios are to stock from the same process. On a shared machine (see load_average) absolute figures are "
        "noisy, the ratios less so.",
        "load_average": {"start": args.load_at_start, "end": round(os.getloadavg()[0], 2)},  # 1-minute, this machine
        "rows": rows,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    staging = path.with_suffix(".json.tmp")
    staging.write_text(json.dumps(record, indent=1) + "\n")
    staging.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", action="extend", default=None)
    parser.add_argument("--size", choices=sorted(SIZES), default="reference")
    parser.add_argument("--layers", type=int, default=None, help="Fewer layers than the size has (shorter runs).")
    parser.add_argument("--repeats", type=int, default=3, help="Rounds measured (median), after one warm-up call.")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--memory-repeats", type=int, default=2, help="CPU: rounds of the separate memory process (median)."
    )
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads in the measuring process.")
    parser.add_argument("--variants", nargs="+", action="extend", default=None, choices=VARIANTS)
    parser.add_argument("--passes", nargs="+", action="extend", default=None, choices=MODES)
    parser.add_argument("--out", type=Path, default=None, help="Write the figures and the command to this JSON file.")
    parser.add_argument("--recompute", type=Path, default=None, help="Recompute the ratios of a JSON written by --out.")
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.load_at_start = round(os.getloadavg()[0], 2)  # recorded with the figures: how shared the machine was
    if args.recompute:
        recompute(args.recompute)
        return
    variants = args.variants or list(VARIANTS)
    if args.size in ENCODERS:
        variants = [v for v in variants if v not in ("alibi-flex", "tupe-dense", "tupe-r")]
    if args.repeats < 1 or args.memory_repeats < 1:
        parser.error("--repeats and --memory-repeats must be at least 1")
    if args._one:  # child process: one (length, pass), every variant
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        length, mode, what = args._one.split(",")
        print(json.dumps(measure_all(variants, int(length), mode, what, args)))
        return
    results = {}
    for length in args.lengths or [512, 1024, 2048, 4096]:
        for mode in args.passes or list(MODES):
            chosen = [v for v in variants if not (v == "alibi-flex" and mode == "fwd+bwd" and args.device == "cpu")]
            # (torch 2.13: "FlexAttention does not support backward on CPU")
            measured = measure(chosen, length, mode, args)
            if measured is not None:
                results[length, mode] = measured
                for variant, r in measured.items():
                    print(
                        f"  {variant:13s} {length:6d} {mode:8s} {r['time']:8.3f} s  {r['peak'] / 2**20:9.1f} MiB",
                        file=sys.stderr,
                        flush=True,
                    )
    rows = ratios(results)
    print_table(rows, args)
    if args.out:
        write_json(args.out, rows, args)


if __name__ == "__main__":
    main()
