"""``posswap export``: rewrite a RoPE-patched checkpoint as a native transformers architecture that computes the
same function, so that serving engines (vLLM, TGI, llama.cpp's converter) that know nothing of posswap run it.

- GPT-2 + RoPE -> GPT-NeoX (sequential residual, biased attention, tied embeddings): no, linear or YaRN scaling,
  full or partial rotary. posswap rotates halves (``rotate_half``) as GPT-NeoX does: only the qkv layout changes.
- BERT / RoBERTa / XLM-R / ELECTRA + RoPE -> RoFormer: full rotary, theta 10000, no scaling. RoFormer rotates
  interleaved pairs, so the q/k rows of every head are reordered.

The written folder is loaded back with plain transformers and its logits compared with the posswap model's before
it is moved into place; anything else is refused with one line that points to the remote-code folder.
"""

from __future__ import annotations

import json
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import Any

import torch
import transformers
from torch import nn

from .config import check_flags
from .files import check_folder_target, write_folder
from .methods.rope import RopeConfig
from .patching import CONFIG_KEY, patched_config
from .portable.posswap_architectures import find_sites
from .portable.posswap_rotary import resolve_rotary_dim
from .portable.posswap_runtime import needs_runtime_code
from .registry import get_method

TOLERANCE = 1e-4  # max |logit difference| an export may have
REMOTE = "load the posswap folder with trust_remote_code=True or posswap.from_pretrained instead"

# RoFormer has the BERT family's heads under "RoFormer" + suffix (the family's prefix: Architecture.class_prefix).
ROFORMER_HEADS = ("Model", "ForMaskedLM", "ForTokenClassification", "ForSequenceClassification")
GPT_NEOX_HEADS = {"GPT2LMHeadModel": "GPTNeoXForCausalLM", "GPT2Model": "GPTNeoXModel"}


@dataclass
class Exported:
    path: Path
    architecture: str  # the native class written, e.g. "GPTNeoXForCausalLM"
    max_difference: float  # max |logit difference| against the posswap model, measured in float64


@dataclass
class Target:
    architecture: str
    config: transformers.PretrainedConfig
    state: dict[str, torch.Tensor]
    causal: bool
    extra_config: dict[str, Any]  # keys added to config.json after save_pretrained (older readers' names)


def export(
    name_or_path: nn.Module | str | os.PathLike,
    out: str | os.PathLike,
    *,
    tokenizer: Any = None,
    overwrite: bool = False,
) -> Exported:
    """Write ``name_or_path`` (a posswap model, or a folder / Hub id loaded with ``posswap.from_pretrained``) to the
    new folder ``out`` as a native transformers model, when one computes the same logits (within 1e-4).

    The tokenizer of a source folder (or ``tokenizer``) is saved along; ``posswap.push_to_hub(out, repo_id)``
    uploads the result. ``overwrite`` replaces a model folder at ``out`` written earlier (never the source folder).
    Raises ``ValueError`` with a one-line reason when no exact native architecture exists.
    """
    check_flags(overwrite=overwrite)  # "no" would replace the folder at out
    source = None
    if isinstance(name_or_path, (str, os.PathLike)):
        from .loading import load_model_and_tokenizer, resolve_model_id

        source = resolve_model_id(name_or_path)  # posswap:minilm -> its folder, so it is never overwritten
    out = check_folder_target(out, overwrite, source)  # refused before any work, as is a damaged MODEL
    if source is not None:
        check_model_files(source)
        model, folder_tokenizer = load_model_and_tokenizer(source)
        tokenizer = tokenizer or folder_tokenizer
    else:
        model = name_or_path
    target = native_target(model)
    difference = _write_checked(model, target, tokenizer, out, overwrite, source)
    return Exported(out, target.architecture, difference)


def check_model_files(name_or_path: str) -> None:
    """A local model folder's files, read before any work: its ``config.json`` (the transformer's, in a
    sentence-transformers folder) is JSON with a ``model_type``, and each ``*.safetensors`` file beside it has a
    readable header. One line naming the file and what to do otherwise; a Hub id is left to the loader."""
    root = Path(name_or_path)
    if not root.is_dir():
        return
    modules = _json_file(root / "modules.json") if (root / "modules.json").is_file() else None
    parts = [m for m in modules or () if isinstance(m, dict) and str(m.get("type")).endswith(".Transformer")]
    inner = str(parts[0].get("path") or "") if parts else ""  # where the transformer is ("": the folder itself)
    folder = root / inner
    if not (folder / "config.json").is_file():
        raise OSError(
            f"{folder} has no config.json, so it is not a model folder: give the folder that save_pretrained or "
            "posswap patch wrote, or save or download the model again."
        )
    config = _json_file(folder / "config.json")
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ValueError(
            f"{folder / 'config.json'} has no model_type, so transformers cannot tell which model it is: save or "
            "download the model again."
        )
    for weights in sorted(folder.glob("*.safetensors")):
        _check_safetensors(weights)


def _json_file(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(
            f"{path} is not valid JSON ({error}): the file is damaged or cut short; save or download the model again."
        ) from None


def _check_safetensors(path: Path) -> None:
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt"):
            pass
    except (SafetensorError, OSError) as error:
        raise ValueError(
            f"{path} is not a readable safetensors file ({error}): it is damaged or cut short; save or download "
            "the model again."
        ) from None


def native_target(model: nn.Module) -> Target:
    """The native architecture, config and weights that reproduce ``model``; ValueError when there is none."""
    rope = _rope_settings(model)
    original = getattr(model.config, CONFIG_KEY)["original_length"]
    native = find_sites(model).arch.native_export
    if native == "gpt_neox":
        return gpt_neox_target(model, rope, original)
    if native == "roformer":
        return roformer_target(model, rope)
    raise _refuse(
        model, f"no transformers architecture computes rope positions with {model.config.model_type}'s layout"
    )


def _refuse(model: nn.Module, reason: str) -> ValueError:
    return ValueError(f"No exact native export for {type(model).__name__.removeprefix('Posswap')}: {reason}; {REMOTE}.")


def _rope_settings(model: nn.Module) -> RopeConfig:
    position = patched_config(model)
    if position is None:
        raise ValueError(
            f"{type(model).__name__} is not patched by posswap: it already is a native transformers model."
        )
    block = position.to_dict()
    if not needs_runtime_code(block):
        raise ValueError(
            f"{position.method} only changed weights, so the folder save_pretrained writes is already native "
            "(AutoModel loads it without trust_remote_code): there is nothing to export."
        )
    refusal = get_method(position.method).export_refusal
    reason = (
        refusal(block)
        if refusal is not None
        else f"no transformers architecture computes {position.method!r} positions for {model.config.model_type}"
    )
    if reason is not None:
        raise _refuse(model, reason)
    return position  # a RopeConfig: the one method whose export_refusal lets a config through


# --- GPT-2 -> GPT-NeoX -------------------------------------------------------------------------------------------

# GPT-2 block names -> GPT-NeoX's (after the base-model prefix).
GPT_NEOX_RENAMES = [
    (r"^wte\.", "embed_in."),
    (r"^h\.(\d+)\.ln_1\.", r"layers.\1.input_layernorm."),
    (r"^h\.(\d+)\.ln_2\.", r"layers.\1.post_attention_layernorm."),
    (r"^h\.(\d+)\.attn\.c_attn\.", r"layers.\1.attention.query_key_value."),
    (r"^h\.(\d+)\.attn\.c_proj\.", r"layers.\1.attention.dense."),
    (r"^h\.(\d+)\.mlp\.c_fc\.", r"layers.\1.mlp.dense_h_to_4h."),
    (r"^h\.(\d+)\.mlp\.c_proj\.", r"layers.\1.mlp.dense_4h_to_h."),
    (r"^ln_f\.", "final_layer_norm."),
]


def gpt_neox_target(model: nn.Module, rope: RopeConfig, original: int) -> Target:
    c = model.config
    name = type(model).__name__.removeprefix("Posswap")
    if name not in GPT_NEOX_HEADS:
        raise _refuse(model, f"only {' and '.join(GPT_NEOX_HEADS)} have a GPT-NeoX counterpart")
    if not c.scale_attn_weights or c.scale_attn_by_inverse_layer_idx:
        raise _refuse(model, "GPT-NeoX always scales attention by 1/sqrt(head_dim), and this GPT-2 does not")
    head_dim = c.n_embd // c.n_head
    rotary_dim = resolve_rotary_dim(rope.rotary_dim, head_dim)
    fraction = rotary_dim / head_dim
    if int(head_dim * fraction) != rotary_dim:  # how GPT-NeoX turns the fraction back into dims
        raise _refuse(model, f"rotary_dim {rotary_dim} of {head_dim} is not a fraction GPT-NeoX reads back exactly")
    parameters = {
        "rope_type": rope.rope_type or "default",
        "rope_theta": float(rope.theta),
        "partial_rotary_factor": fraction,
    }
    if rope.rope_type:  # the factor posswap resolved: the explicit one, else new length / original length
        parameters["factor"] = float(max(rope.factor or rope.max_length / original, 1.0))
    if rope.rope_type == "yarn":
        parameters["original_max_position_embeddings"] = original
    config = transformers.GPTNeoXConfig(
        vocab_size=c.vocab_size,
        hidden_size=c.n_embd,
        num_hidden_layers=c.n_layer,
        num_attention_heads=c.n_head,
        intermediate_size=c.n_inner or 4 * c.n_embd,
        hidden_act=c.activation_function,
        layer_norm_eps=c.layer_norm_epsilon,
        hidden_dropout=c.resid_pdrop,
        attention_dropout=c.attn_pdrop,
        initializer_range=c.initializer_range,
        max_position_embeddings=rope.max_length,
        bos_token_id=c.bos_token_id,
        eos_token_id=c.eos_token_id,
        pad_token_id=c.pad_token_id,
        tie_word_embeddings=c.tie_word_embeddings,
        use_parallel_residual=False,
        attention_bias=True,
        rope_parameters=dict(parameters),
    )
    # llama.cpp's converter reads rotary_pct; older transformers read rotary_emb_base and rope_scaling.
    legacy = {
        "rotary_pct": fraction,
        "rotary_emb_base": float(rope.theta),
        "rope_scaling": parameters if rope.rope_type else None,
    }
    return Target(GPT_NEOX_HEADS[name], config, gpt_neox_state(model), causal=True, extra_config=legacy)


def gpt_neox_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """GPT-2 weights under GPT-NeoX names: Conv1D (in, out) transposed to Linear (out, in), c_attn's
    [Q | K | V] regrouped per head as [q_h | k_h | v_h] (GPT-NeoX's query_key_value layout)."""
    heads = model.config.n_head
    is_base = model.base_model is model
    source, target = ("", "") if is_base else ("transformer.", "gpt_neox.")
    state = {}
    for key, value in model.state_dict().items():
        if not key.startswith(source) or key == "lm_head.weight":
            state[key] = value  # the LM head: same name and layout
            continue
        name = key[len(source) :]
        for pattern, replacement in GPT_NEOX_RENAMES:
            name = re.sub(pattern, replacement, name)
        if name.startswith("layers.") and value.dim() == 2:
            value = value.t()
        if ".query_key_value." in name:
            value = _qkv_per_head(value, heads)
        state[target + name] = value.contiguous()
    return state


def _qkv_per_head(weight: torch.Tensor, heads: int) -> torch.Tensor:
    # Rows [Q | K | V], each heads x head_dim -> rows grouped by head: [q_0 k_0 v_0 | q_1 k_1 v_1 | ...].
    return weight.reshape(3, heads, -1, *weight.shape[1:]).transpose(0, 1).reshape(weight.shape)


# --- BERT family -> RoFormer -------------------------------------------------------------------------------------

# Masked-LM heads that are not laid out as BERT's (cls.predictions.*), renamed to it.
ROFORMER_HEAD_RENAMES = {
    "roberta": [
        ("lm_head.dense.", "cls.predictions.transform.dense."),
        ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
        ("lm_head.decoder.", "cls.predictions.decoder."),
        ("lm_head.bias", "cls.predictions.bias"),
    ],
    "electra": [
        ("generator_predictions.dense.", "cls.predictions.transform.dense."),
        ("generator_predictions.LayerNorm.", "cls.predictions.transform.LayerNorm."),
        ("generator_lm_head.", "cls.predictions.decoder."),
    ],
}
ROFORMER_HEAD_RENAMES["xlm-roberta"] = ROFORMER_HEAD_RENAMES["camembert"] = ROFORMER_HEAD_RENAMES["roberta"]


def roformer_target(model: nn.Module, rope: RopeConfig) -> Target:
    c = model.config
    head = type(model).__name__.removeprefix("Posswap").removeprefix(find_sites(model).arch.class_prefix)
    reason = _roformer_refusal(model, rope, head)
    if reason:
        raise _refuse(model, reason)
    keep = (
        "vocab_size",
        "hidden_size",
        "num_hidden_layers",
        "num_attention_heads",
        "intermediate_size",
        "hidden_act",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "type_vocab_size",
        "initializer_range",
        "layer_norm_eps",
        "pad_token_id",
        "bos_token_id",
        "eos_token_id",
        "tie_word_embeddings",
        "id2label",
        "label2id",
        "problem_type",
    )
    config = transformers.RoFormerConfig(
        **{k: getattr(c, k) for k in keep if hasattr(c, k)},
        embedding_size=getattr(c, "embedding_size", c.hidden_size),  # ELECTRA's projection maps to RoFormer's
        max_position_embeddings=rope.max_length,
    )
    return Target("RoFormer" + head, config, roformer_state(model), causal=False, extra_config={})


def _roformer_refusal(model: nn.Module, rope: RopeConfig, head: str) -> str | None:
    c = model.config
    head_dim = c.hidden_size // c.num_attention_heads
    if rope.theta != 10000 or rope.rope_type or resolve_rotary_dim(rope.rotary_dim, head_dim) != head_dim:
        return "RoFormer rotates whole heads with theta 10000 and no scaling"
    if head not in ROFORMER_HEADS:
        return f"RoFormer has no head like {head!r}"
    if head == "ForSequenceClassification" and c.model_type != "electra":
        return "its classifier reads a tanh pooler, RoFormer's applies hidden_act"
    if c.model_type != "bert" and head in ("ForMaskedLM", "ForSequenceClassification") and c.hidden_act != "gelu":
        return f"its head applies gelu, RoFormer's applies hidden_act={c.hidden_act!r}"
    return None


def roformer_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """BERT-family weights under RoFormer names; each head's q/k rows reordered from posswap's half split
    (x_i pairs with x_{i+d/2}) to RoFormer's interleaved pairs (x_{2i} with x_{2i+1}). The pooler is left out:
    RoFormerModel has none."""
    heads = model.config.num_attention_heads
    prefix = "" if model.base_model is model else model.base_model_prefix + "."
    renames = ROFORMER_HEAD_RENAMES.get(model.config.model_type, [])
    state = {}
    for key, value in model.state_dict().items():
        if key.startswith(prefix + "pooler.") or key.endswith(("position_ids", "token_type_ids")):
            continue
        name = ("roformer." + key[len(prefix) :]) if prefix and key.startswith(prefix) else key
        for old, new in renames:
            name = new + name[len(old) :] if name.startswith(old) else name
        if re.search(r"attention\.self\.(query|key)\.", name):
            value = _interleaved(value, heads)
        state[name] = value.contiguous()
    if "cls.predictions.decoder.bias" in state:  # RoFormer ties the decoder's bias to cls.predictions.bias
        state.setdefault("cls.predictions.bias", state["cls.predictions.decoder.bias"])
    return state


def _interleaved(weight: torch.Tensor, heads: int) -> torch.Tensor:
    # Per head, rows [x_0 .. x_{d/2-1} | x_{d/2} .. x_{d-1}] -> [x_0, x_{d/2}, x_1, x_{d/2+1}, ...].
    return weight.reshape(heads, 2, -1, *weight.shape[1:]).transpose(1, 2).reshape(weight.shape)


# --- build, write, check -----------------------------------------------------------------------------------------


def build_native(target: Target, dtype: torch.dtype) -> nn.Module:
    """The native model with the mapped weights; every weight must land (RoFormer's sinusoid table is built)."""
    native = getattr(transformers, target.architecture)(target.config).to(dtype).eval()
    missing, unexpected = native.load_state_dict(target.state, strict=False)
    tied = set(getattr(native, "_tied_weights_keys", None) or {})
    missing = [k for k in missing if k not in tied and "embed_positions" not in k]
    if missing or unexpected:
        raise ValueError(f"Weights do not map onto {target.architecture}: missing {missing}, unexpected {unexpected}.")
    return native


def _write_checked(
    model: nn.Module, target: Target, tokenizer: Any, out: Path, overwrite: bool = False, source: str | None = None
) -> float:
    """Save into a folder beside ``out``, load it back with plain transformers, compare, then move it into place
    (``files.write_folder``: nothing appears at ``out`` unless the check passes)."""
    differences = []

    def write(staging: Path) -> None:
        build_native(target, next(model.parameters()).dtype).save_pretrained(staging)
        _add_config_keys(staging / "config.json", target.extra_config)
        if tokenizer is not None:
            tokenizer.save_pretrained(staging)
        differences.append(max_logit_difference(model, staging, target))
        if not differences[0] <= TOLERANCE:  # also catches NaN
            raise ValueError(
                f"The {target.architecture} export differs from the posswap model by {differences[0]:.2e} "
                f"(limit {TOLERANCE:.0e}), so nothing was written; {REMOTE}."
            )

    write_folder(out, write, overwrite, source)
    return differences[0]


def _add_config_keys(path: Path, keys: dict[str, Any]) -> None:
    if keys:
        config = json.loads(path.read_text())
        path.write_text(json.dumps({**config, **keys}, indent=2, sort_keys=True) + "\n")


@torch.no_grad()
def max_logit_difference(model: nn.Module, folder: Path, target: Target) -> float:
    """Max |logit difference| between ``model`` and the native model in ``folder`` over probe inputs, both in
    float64 so that the number measures the mapping, not rounding."""
    native = getattr(transformers, target.architecture).from_pretrained(folder, dtype=torch.float64).eval()
    worst = 0.0
    with _reference_mode(model):
        for inputs in probe_inputs(model.config, target.causal):
            keep = inputs.get("attention_mask", torch.ones(inputs["input_ids"].shape)).bool()
            difference = (_logits(model(**inputs)) - _logits(native(**inputs))).abs()
            worst = max(worst, float((difference[keep] if difference.dim() > 2 else difference).max()))
    return worst


@contextmanager
def _reference_mode(model: nn.Module):
    """Run ``model`` in eval mode and float64, then give back its mode and every tensor's own dtype (casting
    there and back is lossless). In place rather than on a deepcopy: no second copy of the weights."""
    tensors = lambda: chain(model.named_parameters(), model.named_buffers())  # noqa: E731
    dtypes, training = {name: t.dtype for name, t in tensors()}, model.training
    model.eval().to(torch.float64)
    try:
        yield
    finally:
        for name, t in tensors():
            t.data = t.data.to(dtypes[name])
        model.train(training)


def probe_inputs(config, causal: bool) -> list[dict[str, torch.Tensor]]:
    """Fixed token ids (never the padding id); for causal LMs also left padding and positions near the end."""
    length = min(config.max_position_embeddings, 64)
    ids = torch.randint(0, config.vocab_size, (2, length), generator=torch.Generator().manual_seed(0))
    if config.pad_token_id is not None:
        ids[ids == config.pad_token_id] = (config.pad_token_id + 1) % config.vocab_size
    inputs = [{"input_ids": ids}]
    if causal:
        mask = torch.ones_like(ids)
        mask[1, : length // 4] = 0  # the second row left-padded, positions counted from its first real token
        inputs.append({"input_ids": ids, "attention_mask": mask, "position_ids": (mask.cumsum(-1) - 1).clamp(min=0)})
        far = torch.arange(config.max_position_embeddings - length, config.max_position_embeddings)
        inputs.append({"input_ids": ids, "position_ids": far.expand(2, -1)})  # where scaling matters most
    return inputs


def _logits(output) -> torch.Tensor:
    return output.logits if getattr(output, "logits", None) is not None else output.last_hidden_state
