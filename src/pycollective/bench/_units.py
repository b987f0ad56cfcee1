"""Element counts and byte sizes as people type them: ``1e8``, ``4M``, ``64K``, ``1_000``.

Shared by the command lines of the benchmark and the cost model.
"""

import argparse
from decimal import Decimal, InvalidOperation

__all__ = ["parse_count", "parse_size", "count_arg", "size_arg", "bytes_label"]


def parse_count(text) -> int:
    """Parse an element count such as ``1000``, ``1e8``, ``2.5e6`` or ``1_000``.

    Args:
        text: the string (or an int).

    Returns:
        The count as an ``int`` (>= 0).

    Raises:
        ValueError: when the text is not a non-negative integral number.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        value = Decimal(text)
    else:
        try:
            # Decimal, not float: "123456789012345678" must stay exact.
            value = Decimal(str(text).strip().replace("_", ""))
        except InvalidOperation:
            raise ValueError(f"{text!r} is not a number (use e.g. 1000 or 1e8)") from None
    if not value.is_finite():
        raise ValueError(f"{text!r} is not a finite number")
    if value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole number of elements")
    if value < 0:
        raise ValueError(f"{text!r} is negative")
    return int(value)


_SUFFIXES = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text) -> int:
    """Parse a byte size: a number as for :func:`parse_count`, or with a K/M/G (binary) suffix.

    Args:
        text: e.g. ``4``, ``1e6``, ``64K``, ``1M``, ``0.5G`` (a trailing ``B`` is allowed).

    Returns:
        The size in bytes as an ``int``.

    Raises:
        ValueError: for anything else (including sizes that are not whole bytes).
    """
    s = str(text).strip().upper()
    if s.endswith("B"):
        s = s[:-1]
    scale = 1
    if s[-1:] in _SUFFIXES:
        s, scale = s[:-1], _SUFFIXES[s[-1]]
    try:
        value = Decimal(s.replace("_", "")) * scale
    except InvalidOperation:
        raise ValueError(f"{text!r} is not a size (use e.g. 8, 1e6, 64K, 1M, 1G)") from None
    try:
        return parse_count(value)
    except ValueError:
        raise ValueError(f"{text!r} is not a whole, non-negative number of bytes") from None


def _argtype(parse):
    def convert(text):
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    convert.__name__ = parse.__name__.replace("parse_", "")
    return convert


#: argparse ``type=`` converters with the parsers' messages.
count_arg = _argtype(parse_count)
size_arg = _argtype(parse_size)


def bytes_label(n) -> str:
    """``4K``, ``1.5M``, ``12B``: a size for table headers (binary units)."""
    for unit, size in (("G", 1 << 30), ("M", 1 << 20), ("K", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return f"{n}B"
