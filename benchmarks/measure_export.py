"""Max |logit diff| (float64 check inside posswap.export) of native exports, per case."""

import os
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
from conftest import make_model, sharpen_qk
from transformers import AutoModel

import posswap
from posswap.loading import minilm_path

root = tempfile.mkdtemp()
cases = []
for scaling in (None, "linear", "yarn"):
    for rotary_dim in (None, 0.5):
        cases.append(
            (
                f"gpt2 rope rope_type={scaling} rotary_dim={rotary_dim}",
                "gpt2",
                "GPT2LMHeadModel",
                posswap.RopeConfig(max_length=128, rope_type=scaling, rotary_dim=rotary_dim),
            )
        )
for mt, head in (
    ("bert", "BertForMaskedLM"),
    ("roberta", "RobertaForMaskedLM"),
    ("xlm-roberta", "XLMRobertaForMaskedLM"),
    ("electra", "ElectraForTokenClassification"),
    ("bert", "BertModel"),
):
    cases.append((f"{mt} {head} rope", mt, head, posswap.RopeConfig(max_length=128)))
for i, (name, mt, head, config) in enumerate(cases):
    model = posswap.patch(sharpen_qk(make_model(mt, head)), config)
    result = posswap.export(model, f"{root}/{i}")
    print(f"| {name} | {result.architecture} | {result.max_difference:.1e} |")
mini = posswap.patch(AutoModel.from_pretrained(minilm_path()), posswap.RopeConfig(max_length=1024))
result = posswap.export(mini, f"{root}/minilm")
print(f"| real MiniLM BertModel rope 512->1024 | {result.architecture} | {result.max_difference:.1e} |")
for name, config in (
    ("alibi", posswap.AlibiConfig(max_length=128)),
    ("rope dynamic", posswap.RopeConfig(max_length=128, rope_type="dynamic")),
):
    try:
        posswap.export(posswap.patch(make_model("gpt2", "GPT2LMHeadModel"), config), f"{root}/refused")
    except ValueError as error:
        print(f"| refused: {name} | {str(error)[:90]} |")
