"""onnxruntime's own attention kernel for an encoder's graph: each standard ``Attention`` node (opset 23, what
torch's exporter writes for scaled_dot_product_attention) becomes onnxruntime's ``com.microsoft.MultiHeadAttention``
with the keys' padding mask, which runs blocked on the CPU instead of materialising and masking the whole score
matrix. Encoders only: their mask is the keys' padding, the same for every query (row 0 of the 4-d mask)."""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper


def use_multi_head_attention(path, num_heads: int) -> int:
    """Rewrite the graph at ``path`` in place; returns how many Attention nodes were replaced."""
    model = onnx.load(str(path))
    nodes, replaced = [], 0
    for node in model.graph.node:
        if node.op_type != "Attention" or node.domain not in ("", "ai.onnx") or _is_causal(node):
            nodes.append(node)
            continue
        nodes.extend(_multi_head(node, num_heads, f"posswap_mha_{replaced}"))
        replaced += 1
    if replaced:
        del model.graph.node[:]
        model.graph.node.extend(nodes)
        model.graph.initializer.extend(
            [
                helper.make_tensor("posswap_bsd", TensorProto.INT64, [3], [0, 0, -1]),
                helper.make_tensor("posswap_bshd", TensorProto.INT64, [4], [0, 0, num_heads, -1]),
                helper.make_tensor("posswap_zero", TensorProto.INT64, [], [0]),
            ]
        )
        if not any(o.domain == "com.microsoft" for o in model.opset_import):
            model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
        onnx.save(model, str(path))
    return replaced


def _is_causal(node) -> bool:
    return any(a.name == "is_causal" and a.i for a in node.attribute)


def _multi_head(node, num_heads: int, name: str) -> list:
    """(B, H, S, D) query / key / value -> (B, S, H*D); the bool (B, 1, S, S) mask -> keys' int32 (B, S)."""
    out = []
    flat = []
    for i, x in enumerate(node.input[:3]):
        out.append(helper.make_node("Transpose", [x], [f"{name}_t{i}"], perm=[0, 2, 1, 3]))
        out.append(helper.make_node("Reshape", [f"{name}_t{i}", "posswap_bsd"], [f"{name}_f{i}"]))
        flat.append(f"{name}_f{i}")
    scale = [a.f for a in node.attribute if a.name == "scale"]
    attributes = {"num_heads": num_heads, **({"scale": scale[0]} if scale else {})}
    if len(node.input) > 3 and node.input[3]:
        out.extend(_masked_or_not(node.input[3], flat, attributes, name))
    else:
        out.append(helper.make_node("MultiHeadAttention", flat, [f"{name}_o"], domain="com.microsoft", **attributes))
    out.append(helper.make_node("Reshape", [f"{name}_o", "posswap_bshd"], [f"{name}_o4"]))
    out.append(helper.make_node("Transpose", [f"{name}_o4"], [node.output[0]], perm=[0, 2, 1, 3]))
    return out


def _masked_or_not(mask: str, flat: list[str], attributes: dict, name: str) -> list:
    """An ``If``: without padding, the kernel's unmasked path (onnxruntime's CPU flash attention, which takes no
    mask); with padding, the keys' mask."""
    keys = f"{name}_keys"
    out = [
        helper.make_node("Gather", [mask, "posswap_zero"], [f"{name}_m1"], axis=1),
        helper.make_node("Gather", [f"{name}_m1", "posswap_zero"], [f"{name}_m2"], axis=1),
        helper.make_node("Cast", [f"{name}_m2"], [keys], to=TensorProto.INT32),
        helper.make_node("ReduceMin", [keys], [f"{name}_least"], keepdims=0),
        helper.make_node("Cast", [f"{name}_least"], [f"{name}_full"], to=TensorProto.BOOL),
    ]
    branches = {}
    for branch, inputs in (("then", flat), ("else", [*flat, "", keys])):
        result = f"{name}_{branch}_o"
        kernel = helper.make_node("MultiHeadAttention", inputs, [result], domain="com.microsoft", **attributes)
        branches[branch] = helper.make_graph(
            [kernel], f"{name}_{branch}", [], [helper.make_tensor_value_info(result, TensorProto.FLOAT, None)]
        )
    out.append(
        helper.make_node(
            "If", [f"{name}_full"], [f"{name}_o"], then_branch=branches["then"], else_branch=branches["else"]
        )
    )
    return out
