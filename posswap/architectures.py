"""Per-architecture facts. They live in ``posswap/portable`` because saved models carry them; this is their
name inside the library."""

from .portable.posswap_architectures import (  # noqa: F401
    ARCHITECTURES,
    POSITION_SIZED_BUFFERS,
    Architecture,
    Sites,
    assign_buffers,
    find_sites,
    resized_position_buffers,
)
