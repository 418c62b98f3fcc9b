"""Every method's run-time module, imported once so that each registers its installer and block checks
(``posswap_registry``). A new method's run time is its module ``posswap_<name>.py`` and one line here; a method
registered from outside posswap comes in through ``posswap_outside_methods.py`` (empty but in its saved folders).

Each line names something of the module it imports (``from .posswap_x import y``, never ``from . import
posswap_x``): transformers copies a saved model's code by following imports of that form only.

It travels with saved models (``posswap/portable``), so it imports nothing from posswap.
"""

from .posswap_alibi import install_alibi  # noqa: F401
from .posswap_interpolate import install_interpolate  # noqa: F401
from .posswap_nope import install_nope  # noqa: F401
from .posswap_outside_methods import CARRIED_HERE  # noqa: F401
from .posswap_registry import INSTALLERS
from .posswap_rope import install_rope  # noqa: F401
from .posswap_sinusoidal import install_sinusoidal  # noqa: F401
from .posswap_t5 import install_t5_bias  # noqa: F401
from .posswap_tupe import install_tupe  # noqa: F401

EVERY_INSTALLER = INSTALLERS  # filled by the imports above: import this to have every method registered
