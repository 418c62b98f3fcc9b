"""The run time of the throwaway method ``scaled-table`` (tests/test_new_method.py), in a file of its own.

Saved folders carry this file, so it is written as posswap's run-time modules are: torch and posswap's run-time
modules only, imported relatively. ``register_method(..., runtime_module=<this file>)`` loads it as a module of
``posswap.portable``; in a saved folder it sits beside the copies of those modules.
"""

from __future__ import annotations

from .posswap_registry import installer


class ScaleRows:
    """A forward hook: the table's rows times ``factor``. An object, not a closure: deepcopy gives the copy its own."""

    def __init__(self, factor: float):
        self.factor = factor

    def __call__(self, module, inputs, output):
        return output * self.factor


@installer("scaled-table", keeps_table=True)
def install_scaled_table(model, sites, block: dict) -> None:
    """A hook on the (kept) table. No parameter, so the weights are the table's alone."""
    table = getattr(sites.owner, sites.arch.table)
    if not getattr(table, "scaled_by_posswap_test", False):
        table.register_forward_hook(ScaleRows(float(block["factor"])))
        table.scaled_by_posswap_test = True
