"""Int8 dynamic quantisation of an exported graph with onnxruntime's own quantiser: the weights of every matrix
product with a constant weight in int8, activations quantised per call. What sentence-transformers'
``export_dynamic_quantized_onnx_model`` does through optimum (which cannot be installed beside transformers 5)."""

from __future__ import annotations

import logging
from pathlib import Path


def quantize_int8(graph: Path, out: Path) -> Path:
    """Write the int8 copy of ``graph`` to ``out`` and return ``out``."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    # Its root-logger advice ("consider pre-processing") is for static quantisation of image models: not shown.
    previous = logging.root.manager.disable
    logging.disable(max(previous, logging.WARNING))
    try:
        quantize_dynamic(
            str(graph),
            str(out),
            weight_type=QuantType.QInt8,
            op_types_to_quantize=["MatMul"],  # the projections; the position and token tables stay float
            per_channel=True,
            extra_options={"MatMulConstBOnly": True},  # q.k and attention.v are products of activations: float
        )
    finally:
        logging.disable(previous)
    return out
