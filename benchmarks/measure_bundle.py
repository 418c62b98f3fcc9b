"""Max |logit diff| between trust_remote_code (no posswap) and posswap.from_pretrained, per test case."""

import os
import sys
import tempfile

sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[1] / "tests"))
os.environ["HF_HUB_OFFLINE"] = "1"
from pathlib import Path

import test_portable as tp
import torch
from safetensors.torch import load_file

import posswap

root = Path(tempfile.mkdtemp())
os.environ["HF_MODULES_CACHE"] = str(root / "modules")
jobs, refs = [], {}
for name, (mt, head, auto, config) in tp.CASES.items():
    model = posswap.patch(tp.sharpened(mt, head), config).eval()
    model.save_pretrained(root / name)
    loaded = posswap.from_pretrained(str(root / name)).eval()
    ids, mask = tp.inputs(mt)
    refs[name] = tp.reference(loaded, auto, ids, mask)
    unpatched = tp.sharpened(mt, head).eval()
    jobs.append(
        {
            "name": name,
            "source": str(root / name),
            "auto": auto,
            "ids": ids.tolist(),
            "mask": mask.tolist(),
            "out": str(root / f"{name}.safetensors"),
        }
    )
done = {j["name"]: j for j in tp.load_without_posswap(jobs)}
for name in tp.CASES:
    got = load_file(done[name]["out"])
    d = (got["logits"] - refs[name]["logits"]).abs().max().item()
    g = (
        "same"
        if "generated" not in got
        else ("same" if torch.equal(got["generated"], refs[name]["generated"]) else "DIFFERENT")
    )
    print(f"| {name} | {d:.1e} | {g} | {done[name]['plain'][:40]} |")
