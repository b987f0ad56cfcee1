"""Fixed-width text tables and compact numbers, for every report the project prints."""

import math
from typing import Callable, Sequence, Tuple

__all__ = ["format_table", "format_rows", "fmt_num"]


def format_table(columns: Sequence[Tuple[str, Callable]], rows, prefix: str = "") -> str:
    """Render rows as a fixed-width, right-aligned text table.

    Args:
        columns: ``(header, function(row) -> str)`` pairs.
        rows: row objects passed to the functions.
        prefix: put before every line (``"# "`` makes the header a comment,
            as nccl-tests prints it).

    Returns:
        The table as one string: the header line, then one line per row.
    """
    cells = [[h for h, _ in columns]] + [[str(f(r)) for _, f in columns] for r in rows]
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(line, widths)) for line in cells]
    if prefix:
        lines[0] = prefix + lines[0]
        lines[1:] = [" " * len(prefix) + line for line in lines[1:]]
    return "\n".join(lines)


def fmt_num(x, digits: int = 3) -> str:
    """Compact number: ``digits`` significant figures in fixed point; ``-`` for None."""
    if x is None:
        return "-"
    if isinstance(x, float) and not math.isfinite(x):
        return "inf" if x > 0 else ("nan" if x != x else "-inf")
    if x == 0:
        return "0"
    if abs(x) >= 10 ** digits:
        return f"{x:.0f}"
    decimals = max(0, digits - 1 - int(math.floor(math.log10(abs(x)))))
    return f"{x:.{decimals}f}"


def format_rows(header: Sequence[str], rows, prefix: str = "") -> str:
    """:func:`format_table` for rows that are sequences, one cell per header."""
    return format_table([(h, lambda r, i=i: r[i]) for i, h in enumerate(header)], rows, prefix)
