"""The run-time code of posswap's methods, written to travel: ``save_pretrained`` on a RoPE or ALiBi model
copies ``modeling_posswap.py`` and the ``posswap_*.py`` files it imports beside the weights, so that
``trust_remote_code=True`` loads the model where posswap is not installed.

Rules for every file here: import only torch, transformers and the standard library, and each other with
single-dot relative imports (``from .posswap_functional import ...``): the files land flat in a model folder.
"""
