"""Pure tensor math for position schemes. It lives in ``posswap/portable`` because saved models carry it;
this is its name inside the library."""

from .portable.posswap_functional import (  # noqa: F401
    RESAMPLE_MODES,
    alibi_bias,
    alibi_slopes,
    apply_rotary,
    resample_positions,
    resample_table,
    rope_frequencies,
    rotary_cos_sin,
    sinusoidal_table,
)
