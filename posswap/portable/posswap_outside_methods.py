"""The run-time modules of methods registered outside posswap that a saved folder carries.

In posswap this file names none: ``register_method(..., runtime_module=path)`` loads such a module itself. The
folder ``save_pretrained`` writes for a model of such a method gets its own copy of this file
(``posswap_carry.carry_method``), which imports the method's module, copied beside it, and registers its saved
keys. ``posswap_methods.py`` imports this file, so that folder's code installs the method without posswap.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

CARRIED_HERE: tuple[str, ...] = ()  # the methods whose run-time module this folder carries
