"""Numbers for people, one way everywhere: GPU and computer memory in GiB, parameter counts, short durations.

Memory: the sizing computes in decimal gigabytes (bytes / 10^9, as PyTorch's byte counts divide), while a card's
memory is sold in binary units: a "24 GB" RTX 4090 holds 24 GiB (25.8 decimal GB). Shown side by side, "24 GB card"
beside "25.0 GB usable" reads as if a card gave more than it holds. So every memory figure the app shows is in GiB,
the unit of the card's own size, of ``nvidia-smi`` and of PyTorch's out-of-memory messages, and says so ("GiB").
Files and downloads stay in decimal MB and GB, as file managers count them.
"""

from __future__ import annotations

#: Bytes in a GiB, and decimal gigabytes in a GiB.
GIB_BYTES = 2**30
GB_PER_GIB = GIB_BYTES / 1e9

#: Parameter-count units: (size, short unit, long word).
_COUNT_UNITS = ((1e12, "T", "trillion"), (1e9, "B", "billion"), (1e6, "M", "million"), (1e3, "K", "thousand"))


def gib(gb: float) -> float:
    """Decimal gigabytes (what the sizing computes) in GiB."""
    return gb / GB_PER_GIB


def gb_of_gib(size_gib: float) -> float:
    """GiB (a card's memory) in decimal gigabytes, the sizing's unit."""
    return size_gib * GB_PER_GIB


def memory_text(gb: float, digits: int = 1) -> str:
    """Memory the sizing computed (decimal GB) as people read it: ``23.3 GiB``; a sliver reads ``< 0.1 GiB``.

    Args:
        gb: The amount in decimal gigabytes (bytes / 10^9).
        digits: Decimals shown.
    """
    value = gib(gb)
    smallest = 10.0**-digits
    if 0 < abs(value) < smallest / 2:
        return f"< {smallest:.{digits}f} GiB"
    return f"{value:,.{digits}f} GiB"


def card_text(size_gib: float) -> str:
    """A card's memory as it is sold, in the same unit as :func:`memory_text`: ``24 GiB``, ``80 GiB``."""
    return f"{size_gib:g} GiB"


def bytes_memory_text(count: float, digits: int = 0) -> str:
    """A computer's memory given in bytes: ``32 GiB``."""
    return memory_text(count / 1e9, digits)


def count_text(count: float, *, long: bool = False) -> str:
    """A parameter count: ``1.0 B``, ``494 M``, ``140 K`` (``long``: ``1.00 billion``, ``40.4 million``).

    A count within 0.05 % of a unit takes that unit, so none reads as a thousand of the unit below: Gemma 3 1B's
    999,812,736 parameters read ``1.0 B`` (``1.00 billion``), never ``1000 M``.
    """
    for size, unit, word in _COUNT_UNITS:
        if count >= size * 0.9995:  # 999,812,736 is "1.0 B" and "1.00 billion", never "1000 M" or "999.8 million"
            return f"{count / size:,.{_count_digits(size, long)}f} {word if long else unit}"
    return f"{count:,.0f}"


def _count_digits(size: float, long: bool) -> int:
    """Decimals a count in units of ``size`` is shown with."""
    if size < 1e3:
        return 0
    if long:
        return 2 if size >= 1e9 else 1 if size >= 1e6 else 0
    return 1 if size >= 1e9 else 0
