"""Whether a model name points anywhere: a folder here, the Hub cache, or the Hub. The command line asks before any
work, so that a name found nowhere is one line that says where it was looked for (not transformers' "couldn't
connect", which names neither the folder nor the Hub's answer)."""

from __future__ import annotations

import os

# The files a model folder or repo has at its top: a transformers model's, or a sentence-transformers model's.
TOP_FILES = ("config.json", "modules.json")


def check_model_found(name: str) -> None:
    """``name`` (after :func:`posswap.loading.resolve_model_id`, which refuses a path that does not exist) is a
    folder here, in the Hub cache, or on the Hub; otherwise one line that says where it was looked for."""
    if os.path.exists(name):
        return
    from huggingface_hub import constants, try_to_load_from_cache

    if any(isinstance(try_to_load_from_cache(name, filename), str) for filename in TOP_FILES):
        return
    here = f"No folder {name!r} here"
    if constants.HF_HUB_OFFLINE:
        raise OSError(
            f"{here}, and no model {name!r} in the Hub cache (HF_HUB_OFFLINE is set, so the Hub was not asked): "
            "give a model folder, or unset HF_HUB_OFFLINE to download it."
        )
    from huggingface_hub import HfApi
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    from ..hub import hub_timeout

    try:
        with hub_timeout("run again, or give a model folder"):
            HfApi().model_info(name)
    except GatedRepoError:  # it exists: loading says how to get access
        return
    except RepositoryNotFoundError:
        raise OSError(
            f"{here}, and the Hub has no model {name!r} (or it is private and you are not logged in: hf auth login): "
            "check the name, or give a model folder."
        ) from None
    except (ConnectionError, TimeoutError) as error:
        raise OSError(f"{here}, and {error}") from None
