"""Do posswap's attention kernels agree on a GPU, forward and backward? Each bias method (ALiBi, T5 bias, TUPE-R)
and RoPE, on GPT-2 and BERT, patched from a table of length/4 rows to ``length``, through each kernel (eager:
the reference, sdpa, flex), the same weights: the largest difference of the last hidden state and of every
parameter's gradient from eager's, relative to eager's largest value.

    python benchmarks/gpu_kernels.py --device cuda --length 2048 --out results/speed/gpu-kernels.json

The tests check the same on the CPU at a few dozen tokens (tests/test_alibi.py, test_t5_bias.py, ...: flex
forward only there, torch's CPU flex_attention has no backward); this is the check at length on the device
where flex trains. q and k are sharpened (scaled up) so that the scores, not only the bias, decide where
attention goes. Random weights (seed 0), fp32, batch 2 with the second sequence padded on BERT (a mask).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
import transformers

import posswap

METHODS = {
    "alibi": lambda n, backend: posswap.AlibiConfig(max_length=n, backend=backend),
    "t5-bias": lambda n, backend: posswap.T5BiasConfig(max_length=n, backend=backend),
    "tupe-r": lambda n, backend: posswap.TupeConfig(max_length=n, relative=True, backend=backend),
    "rope": lambda n, backend: posswap.RopeConfig(max_length=n, backend=backend),
}
BACKENDS = ("eager", "sdpa", "flex")
SHAPE = dict(layers=2, hidden=256, heads=4)


def base_model(arch: str, length: int, device: str) -> torch.nn.Module:
    torch.manual_seed(0)
    old = length // 4
    if arch == "bert":
        config = transformers.BertConfig(
            vocab_size=1000,
            hidden_size=SHAPE["hidden"],
            num_hidden_layers=SHAPE["layers"],
            num_attention_heads=SHAPE["heads"],
            intermediate_size=4 * SHAPE["hidden"],
            max_position_embeddings=old,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
        )
        model = transformers.BertModel(config, add_pooling_layer=False)
    else:
        config = transformers.GPT2Config(
            vocab_size=1000,
            n_embd=SHAPE["hidden"],
            n_layer=SHAPE["layers"],
            n_head=SHAPE["heads"],
            n_positions=old,
            attn_pdrop=0.0,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
        )
        model = transformers.GPT2Model(config)
    with torch.no_grad():  # sharper q.k: the scores matter beside the bias
        for name, parameter in model.named_parameters():
            if any(key in name for key in ("c_attn.weight", "query.weight", "key.weight")):
                parameter.mul_(4.0)
    return model.to(device)


def fill_bias_tables(model: torch.nn.Module) -> None:
    """T5 bias and TUPE-R tables start at zero (the patched model reads as before): random values, seeded, so the
    kernels have a bias to disagree on."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "posswap_bias_providers" in name:  # bucket tables: a logit's size; TUPE's projections: smaller
                scale = 0.5 if "relative_attention_bias" in name else 0.05
                parameter.copy_(torch.randn(parameter.shape, generator=generator).to(parameter) * scale)


def run(arch: str, method: str, backend: str, length: int, device: str, ids, mask):
    model = base_model(arch, length, device)
    posswap.patch(model, METHODS[method](length, backend))
    fill_bias_tables(model)
    model.train()
    if device == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    out = model(input_ids=ids, attention_mask=mask).last_hidden_state
    loss = (out * torch.linspace(-1, 1, out.shape[-1], device=device)).sum()
    loss.backward()
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}
    return out.detach(), grads, seconds, model.config._attn_implementation


def relative(a: torch.Tensor, b: torch.Tensor, where: torch.Tensor | None = None, floor: float = 1e-12) -> float:
    """max |a - b| over max |b|; ``floor``: the least denominator (a gradient that is zero in exact arithmetic, as
    the key projection's bias has, is rounding noise on both sides)."""
    if where is not None:
        a, b = a[where], b[where]
    return float((a - b).abs().max() / b.abs().max().clamp_min(floor))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--length", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    rows = []
    for arch in ("gpt2", "bert"):
        ids = torch.randint(0, 1000, (2, args.length), generator=torch.Generator().manual_seed(2)).to(args.device)
        mask = torch.ones_like(ids)
        if arch == "bert":
            mask[1, args.length * 3 // 4 :] = 0  # a padded sequence: its padding's outputs are not compared
        kept = mask.bool()
        for method in METHODS:
            reference = None
            for backend in BACKENDS:
                row = {"arch": arch, "method": method, "backend": backend}
                try:
                    out, grads, seconds, implementation = run(
                        arch, method, backend, args.length, args.device, ids, mask
                    )
                except Exception as error:  # a kernel that cannot run here is a finding, not the end of the check
                    rows.append({**row, "error": f"{type(error).__name__}: {str(error)[:300]}"})
                    print(rows[-1], flush=True)
                    continue
                row |= {"implementation": implementation, "first_call_seconds": round(seconds, 3)}
                if backend == "eager":
                    reference = out, grads
                elif reference is not None:
                    row["output_rel_diff"] = relative(out, reference[0], kept)
                    floor = 1e-3 * max(float(g.abs().max()) for g in reference[1].values())
                    row["grad_rel_diff_max"] = max(relative(grads[n], g, floor=floor) for n, g in reference[1].items())
                    row["grads_compared"] = len(reference[1])
                rows.append(row)
                print(row, flush=True)
    record = {
        "command": "python benchmarks/gpu_kernels.py " + f"--device {args.device} --length {args.length}",
        "device": torch.cuda.get_device_name() if args.device == "cuda" else platform.processor(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "shape": SHAPE,
        "length": args.length,
        "rows": rows,
    }
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
