"""The command line: ``posswap patch|demo|eval|train|study|push|export``, thin (parse, call the library, print).

- ``patch MODEL --method M --out DIR``: patch a checkpoint (or a sentence-transformers folder) and save it;
- ``demo``: patch the embedded MiniLM and show it reads longer inputs;
- ``eval MODEL ...``: score models at each context length (results.json and plots), or retrieval (``retrieval.py``);
- ``train RECIPE``: continued pretraining at the new length from a YAML recipe or a shipped one (``--list``);
- ``study``: the extension study (the copying presets, or the text study on GPT-2 and MiniLM: ``study.py``);
- ``push FOLDER REPO_ID``: upload a saved model with a posswap model card;
- ``export MODEL --out DIR``: write a RoPE model as a native transformers model where one is exact.

``main.py`` runs a command and reports its error in one line; ``parsers.py`` builds the parsers with ``args.py``'s
conventions (one-line errors, no abbreviated flags, list flags) from ``facts.py``, the library's method options and
names written as plain data (``generate.py``), so ``posswap --help`` imports no torch; ``commands.py`` holds the
handlers. Before any work, a model name found nowhere is refused by ``model_sources.py``, a shrinking
``--max-length`` by ``checks.py``.
"""

from .main import build_parser, main

__all__ = ["build_parser", "main"]
