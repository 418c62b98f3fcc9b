"""Forward time of two posswap trees on the study's reference model: what keeping the per-call state out of the
modules (issue 22: cos/sin, the bias and its cache in each call's own state) costs, as a ratio.

    git worktree add --detach /tmp/posswap-before <commit before the change>
    python benchmarks/bench_per_call_state.py --before /tmp/posswap-before --after .

GPT-2 reference size (6 layers, n_embd 256, 8 heads, 8k vocabulary), 256 learned positions patched to 1024,
bare GPT2Model, batch 1 x 1024 (--length), forward under no_grad on the CPU, dropout 0. Each (tree, variant) runs in its own
subprocess with that tree first on PYTHONPATH (both trees register attention functions under the same names, so
they cannot share a process); the subprocesses alternate between the trees, --rounds times, so that a busy machine
slows both alike. Per subprocess: one warm-up, then the median of --repeats forwards; reported: the median over
rounds of those medians (and the best round), per tree, and after / before.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

VARIANTS = ("rope", "alibi")


def measure(variant: str, repeats: int, threads: int, length: int) -> dict:
    import torch
    import transformers

    import posswap

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=6,
        n_embd=256,
        n_head=8,
        vocab_size=8192,
        n_positions=256,
        attn_pdrop=0.0,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
    )
    model = transformers.GPT2Model(config).eval()
    patch = {"rope": posswap.RopeConfig(max_length=1024), "alibi": posswap.AlibiConfig(max_length=1024, backend="sdpa")}
    posswap.patch(model, patch[variant])
    ids = torch.randint(0, config.vocab_size, (1, length))
    times = []
    with torch.no_grad():
        model(input_ids=ids)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            model(input_ids=ids)
            times.append(time.perf_counter() - start)
    return {"median": statistics.median(times), "min": min(times), "posswap": os.path.dirname(posswap.__file__)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", required=True, help="Root of the tree before the change (a git worktree).")
    parser.add_argument("--after", default=".", help="Root of the tree after the change (default: here).")
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads per subprocess (1: steadier on a shared machine)."
    )
    parser.add_argument(
        "--length", type=int, default=1024, help="Tokens per forward (a short one shows the fixed per-call cost)."
    )
    parser.add_argument("--_one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._one:
        print(json.dumps(measure(args._one, args.repeats, args.threads, args.length)))
        return

    trees = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
    runs = {(tree, variant): [] for tree in trees for variant in args.variants}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))  # neither tree always goes first
        for variant in args.variants:
            for tree in order:
                env = {
                    **os.environ,
                    "PYTHONPATH": trees[tree] + os.pathsep + os.environ.get("PYTHONPATH", ""),
                    "OMP_NUM_THREADS": str(args.threads),
                }
                command = [
                    sys.executable,
                    __file__,
                    "--_one",
                    variant,
                    "--before",
                    args.before,
                    "--repeats",
                    str(args.repeats),
                    "--threads",
                    str(args.threads),
                    "--length",
                    str(args.length),
                ]
                done = subprocess.run(command, capture_output=True, text=True, env=env, check=True)
                result = json.loads(done.stdout.strip().splitlines()[-1])
                assert result["posswap"].startswith(trees[tree]), (tree, result["posswap"])
                runs[tree, variant].append(result["median"])
                print(
                    f"  round {round_} {variant:5s} {tree:6s} {result['median'] * 1e3:8.1f} ms (min {result['min'] * 1e3:.1f})",
                    file=sys.stderr,
                    flush=True,
                )

    print(
        f"\nGPT-2 6 x 256, 8 heads, 256 -> 1024 positions, GPT2Model forward, batch 1 x {args.length}, CPU, {args.threads} thread(s); "
        f"median over {args.rounds} rounds of the median of {args.repeats} forwards (best round in brackets)"
    )
    print("| variant | before ms | after ms | after / before |")
    print("|---|---|---|---|")
    for variant in args.variants:
        before, after = runs["before", variant], runs["after", variant]
        b, a = statistics.median(before), statistics.median(after)
        print(
            f"| {variant} | {b * 1e3:.1f} ({min(before) * 1e3:.1f}) | {a * 1e3:.1f} ({min(after) * 1e3:.1f}) | {a / b:.3f} ({min(after) / min(before):.3f}) |"
        )


if __name__ == "__main__":
    main()
