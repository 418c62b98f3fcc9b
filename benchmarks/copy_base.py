"""The repeat probe on a base that copies. Neither study base copies inside its own window (README, "the repeat
probe"), so the study's probe cannot show whether an extended model reads back past that window. This benchmark
makes a base that does and asks the probe's question of the study's variants:

1. a 2-layer GPT-2 with a learned table of 256 positions is trained from scratch on random tokens where every
   window carries a span copied further on (posswap's ``data.repeat_fraction`` transform), so copying is the only
   thing to learn; it must then show the probe's drop at d < 1x, or the run stops and says so;
2. each variant (``posswap.study.plan.variant_patch``: 4x for tables, 8x for the rest) is probed right after the
   patch, trained the same steps on 1024-token windows of the same kind, and probed again; the original is trained
   the same tokens at 256 and reads longer sequences with a sliding window, as in the study.

Random tokens are the classic induction-head test: the first occurrence cannot be predicted, so the drop is all
copying (at most log V). A variant that reads back past its old window shows it at d = 1.5x and 3x.

    python benchmarks/copy_base.py --base-from out/copy-base --out results/copy_base   # trains and saves the base first
    python benchmarks/copy_base.py --base-from out/copy-base --variants alibi,rope     # reuses it

Measured on 2 CPU cores: the base did not get past the induction plateau. 3,500 steps of 32 x 256 (28.7M tokens,
32 min, span 96, lr 1e-3) left its loss at log 512 = 6.24 and the drop at 0.00 for d = 0, 64 and 128, so the run
stops at step 1 with the probe check's message. It is meant for the GPU machine (``--device cuda``, the default
there; not yet run on one), where a 2-layer model runs tens of thousands of steps in minutes. The variants' part
ran end to end on an untrained base (every variant patches, trains and is probed).
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch
from datasets import Dataset
from tqdm.auto import tqdm
from transformers import GPT2Config, GPT2LMHeadModel, get_cosine_schedule_with_warmup

import posswap
from posswap.evaluation.plots import plot_repeat
from posswap.evaluation.repeat import repeat_probe
from posswap.study.plan import CAUSAL_MULTIPLES, EXTEND, VARIANTS, variant_patch
from posswap.study.report import probe_check, probe_table
from posswap.training.data import with_repeated_spans

LENGTH, VOCAB, PROBE_SPAN = 256, 512, 32  # the base's window; random ids; the probe's span


def copy_batches(steps: int, batch: int, length: int, span: int, seed: int):
    """``steps`` batches of ``batch`` windows of random ids, each window with one span of ``span`` copied further
    on; made 256 batches at a time (a long base run does not fit in memory at once), each chunk seeded apart."""
    for chunk, first in enumerate(range(0, steps, 256)):
        count = min(256, steps - first) * batch
        generator = torch.Generator().manual_seed(seed * 1_000_003 + chunk)
        ids = torch.randint(0, VOCAB, (count, length), generator=generator)
        rows = with_repeated_spans(Dataset.from_dict({"input_ids": ids.tolist()}), 1.0, span, seed * 1_000_003 + chunk)
        yield from torch.tensor(rows["input_ids"]).split(batch)


def train(model, batches, steps: int, lr: float, desc: str) -> float:
    """AdamW over ``steps`` of ``batches``, 5% warmup then cosine; the mean loss of the last 50 steps."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimizer, max(1, steps // 20), steps)
    model.train()
    device, losses = next(model.parameters()).device, []
    for ids in tqdm(batches, total=steps, desc=desc):
        ids = ids.to(device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return sum(losses[-50:]) / len(losses[-50:])


def probe(model, stream: torch.Tensor, spans: int) -> dict:
    distances = [round(m * LENGTH) for m in CAUSAL_MULTIPLES]
    return repeat_probe(model.eval(), None, stream, span=PROBE_SPAN, distances=distances, spans_per_distance=spans, progress=False)


def make_base(args) -> GPT2LMHeadModel:
    """The copying base: loaded from ``--base-from``, or trained (and saved there when given)."""
    if args.base_from and (Path(args.base_from) / "config.json").exists():
        model = GPT2LMHeadModel.from_pretrained(args.base_from).to(args.device)
        model.loss_type = "ForCausalLM"  # else transformers warns "loss_type=None ... unrecognized" (as posswap train)
        return model
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=128, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(config).to(args.device)
    model.loss_type = "ForCausalLM"
    train(model, copy_batches(args.base_steps, 32, LENGTH, args.base_span, seed=1), args.base_steps, 1e-3, "base: learn to copy")
    if args.base_from:
        model.save_pretrained(args.base_from)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/copy_base"))
    parser.add_argument("--base-from", help="folder of a saved base (trained and saved there if it has none)")
    parser.add_argument("--base-steps", type=int, default=20000, help="steps of 32 x 256 tokens to teach the base to copy")
    parser.add_argument("--base-span", type=int, default=96, help="copied span in the base's training windows")
    parser.add_argument("--steps", type=int, default=150, help="steps of 8 x 1024 tokens for each variant")
    parser.add_argument("--lr", type=float, default=3e-4, help="learning rate of the variants and the baseline")
    parser.add_argument("--spans", type=int, default=20, help="probe trials per distance")
    parser.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated study variants")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    variants = args.variants.split(",")
    for name in variants:
        try:
            variant_patch(name, LENGTH)  # an unknown name fails here, before any training
        except ValueError as error:
            parser.error(f"--variants: {error}")
    stream = torch.randint(0, VOCAB, (50_000,), generator=torch.Generator().manual_seed(12345))  # its own seed: held out
    started = time.perf_counter()

    base = make_base(args)
    before = {"original": probe(base, stream, args.spans)}
    check = probe_check({"multiples": list(CAUSAL_MULTIPLES), "models": before})
    if check:
        raise SystemExit(f"The base does not copy yet (train it longer: --base-steps). {check}")

    # Each variant: steps of 8 windows of 1024; the baseline reads the same tokens as 32 windows of 256.
    after, seconds = {}, {}
    baseline = copy.deepcopy(base)
    train(baseline, copy_batches(args.steps, 8 * EXTEND, LENGTH, PROBE_SPAN, seed=2), args.steps, args.lr, "original trained (256)")
    after["original trained"] = probe(baseline, stream, args.spans)
    for name in variants:
        model = posswap.patch(copy.deepcopy(base), variant_patch(name, LENGTH))
        before[name] = probe(model, stream, args.spans)
        clock = time.perf_counter()
        train(model, copy_batches(args.steps, 8, EXTEND * LENGTH, PROBE_SPAN, seed=2), args.steps, args.lr, f"{name} (1024)")
        seconds[name] = round(time.perf_counter() - clock, 1)
        after[name] = probe(model, stream, args.spans)
    write(args, before, {"original": before["original"], **after}, seconds, (time.perf_counter() - started) / 60)


def write(args, before: dict, after: dict, seconds: dict, minutes: float) -> None:
    """probe.json, the before and after plots, and summary.md with the study's probe tables."""
    args.out.mkdir(parents=True, exist_ok=True)
    multiples = list(CAUSAL_MULTIPLES)
    found = {"multiples": multiples, "probe_span": PROBE_SPAN, "vocab": VOCAB, "base_length": LENGTH, "minutes": round(minutes, 1),
             "settings": {k: str(v) for k, v in vars(args).items()}, "train_seconds": seconds, "untrained": before, "trained": after}
    (args.out / "probe.json").write_text(json.dumps(found, indent=1) + "\n")
    plot_repeat(before, LENGTH, args.out / "probe_untrained.png")
    plot_repeat(after, LENGTH, args.out / "probe_trained.png")
    lines = [
        f"# The repeat probe on a base that copies ({minutes:.1f} min)", "",
        f"Loss drop on a repeated span of {PROBE_SPAN} random tokens (vocabulary {VOCAB}: perfect copying drops "
        f"{math.log(VOCAB):.2f} nats), ± standard error over {args.spans} spans. Base: 2-layer GPT-2, 256 learned positions.", "",
        "## Patched, untrained", "", *probe_table({"multiples": multiples, "models": before}), "",
        f"## After {args.steps} steps of 8 x 1024 tokens at lr {args.lr:g} (`original trained`: the same tokens at 256)", "",
        *probe_table({"multiples": multiples, "models": after}), "",
    ]
    (args.out / "summary.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
