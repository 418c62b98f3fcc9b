"""Max |diff| between a RoPE / ALiBi MiniLM at 2048 and the same folder loaded with trust_remote_code where posswap cannot be imported."""

import os
import subprocess
import sys
import tempfile

os.environ["HF_HUB_OFFLINE"] = "1"
import torch
from transformers import AutoModel

import posswap
from posswap.loading import minilm_path

root = tempfile.mkdtemp()
os.environ["HF_MODULES_CACHE"] = root + "/mods"
ids = torch.randint(1000, 20000, (1, 2048), generator=torch.Generator().manual_seed(0))
for method in ("rope", "alibi"):
    m = AutoModel.from_pretrained(minilm_path()).eval()
    posswap.patch(m, {"method": method, "max_length": 2048})
    m.save_pretrained(f"{root}/{method}")
    with torch.no_grad():
        ref = m(ids).last_hidden_state
    torch.save(ids, f"{root}/ids.pt")
    code = f'''
import importlib.abc, sys, torch
class B(importlib.abc.MetaPathFinder):
    def find_spec(self, n, p, t=None):
        if n == "posswap" or n.startswith("posswap."): raise ImportError("blocked")
sys.meta_path.insert(0, B())
from transformers import AutoModel
m = AutoModel.from_pretrained("{root}/{method}", trust_remote_code=True).eval()
ids = torch.load("{root}/ids.pt")
with torch.no_grad(): torch.save(m(ids).last_hidden_state, "{root}/{method}.pt")
'''
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    got = torch.load(f"{root}/{method}.pt")
    print(method, "max |diff| at 2048 tokens:", (got - ref).abs().max().item())
