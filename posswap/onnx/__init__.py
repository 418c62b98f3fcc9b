"""Serving through ONNX: ``posswap export FOLDER --format onnx`` (:mod:`.export`, the graph: :mod:`.graph`,
onnxruntime's attention kernel: :mod:`.attention`, int8: :mod:`.quantize`), :class:`.encoder.OnnxEncoder` that runs
the folder with onnxruntime alone, and :func:`.backed.with_onnx_graph`, a sentence-transformers model whose
transformer runs the graph (to score it on the retrieval tasks).

Nothing is imported here: ``posswap.onnx.encoder`` imports neither torch nor onnx."""
