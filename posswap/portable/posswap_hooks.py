"""Find and remove posswap's hooks by their type. Hooks are found again rather than remembered by handle:
a handle refers to the original module's hook dict, so after ``copy.deepcopy`` it would remove the wrong one."""

from __future__ import annotations

from torch import nn

_HOOK_DICTS = ("_forward_pre_hooks", "_forward_hooks")
# Side tables torch keeps by hook id for hooks registered with with_kwargs / always_call.
_SIDE_TABLES = ("_forward_pre_hooks_with_kwargs", "_forward_hooks_with_kwargs", "_forward_hooks_always_called")


# The KV cache's keyword: transformers 5.24 renamed ``past_key_values`` to ``cache``, and still takes the old name,
# renaming it inside ``forward``: after the hooks ran, so a hook may see either.
CACHE_KWARGS = ("cache", "past_key_values")


def passed_cache(kwargs: dict):
    """The KV cache a call was given by keyword, under either name; None without one."""
    return next((kwargs[name] for name in CACHE_KWARGS if kwargs.get(name) is not None), None)


def call_arguments(signature, module: nn.Module, args: tuple, kwargs: dict) -> dict:
    """A forward call's arguments by name (those of ``**kwargs`` merged in), without ``self``: what a forward
    pre-hook reads, whichever way the caller passed them."""
    bound = signature.bind_partial(module, *args, **kwargs).arguments
    extra = bound.pop("kwargs", {})
    return {name: value for name, value in bound.items() if name != "self"} | extra


def find_hooks(module: nn.Module, kind: type) -> list:
    return [h for name in _HOOK_DICTS for h in getattr(module, name).values() if isinstance(h, kind)]


def remove_hooks(module: nn.Module, kind: type) -> None:
    for name in _HOOK_DICTS:
        hooks = getattr(module, name)
        for key in [k for k, h in hooks.items() if isinstance(h, kind)]:
            del hooks[key]
            for table in _SIDE_TABLES:
                getattr(module, table, {}).pop(key, None)
