"""One file per position method; importing this package imports each module here, so every method registers (its
``register_method`` call). A new method is in by being a file here: no list to edit."""

import importlib
import pkgutil

# The order of the study's variants, its reports and the help: these first (as the study has always run them),
# then any other method, by file name.
FIRST = ("interpolate", "rope", "alibi", "sinusoidal", "nope", "t5_bias", "tupe")

for _name in sorted(
    (m.name for m in pkgutil.iter_modules(__path__)),
    key=lambda n: (n not in FIRST, FIRST.index(n) if n in FIRST else 0, n),
):
    importlib.import_module(f"{__name__}.{_name}")
