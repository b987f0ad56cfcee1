"""How M elements are split into N chunks.

Every chunked algorithm (ring, reduce-scatter, allgather, ...) calls this one
helper, so a rank's slice means the same thing everywhere in the library.

The rule: chunk ``i`` has ``M // N`` elements, plus one more when
``i < M % N``; chunks are laid out in rank order.  So the first ``M % N``
ranks own one extra element, and when ``M < N`` the last ``N - M`` ranks own
an empty chunk.  Offsets are therefore ``i * (M // N) + min(i, M % N)``.
"""

import operator

__all__ = ["partition", "chunk_bounds"]


def _check(count, nranks):
    try:
        count, nranks = operator.index(count), operator.index(nranks)
    except TypeError:
        raise TypeError(f"count and nranks must be integers, got {count!r}, {nranks!r}") from None
    if count < 0:
        raise ValueError(f"count must be non-negative, got {count}")
    if nranks < 1:
        raise ValueError(f"nranks must be positive, got {nranks}")
    return count, nranks


def partition(count, nranks, rank):
    """Return the ``(offset, count)`` of ``rank``'s chunk of ``count`` elements.

    Args:
        count: total number of elements M (any non-negative integer).
        nranks: number of chunks N (the communicator size).
        rank: which chunk, ``0 <= rank < nranks``.

    Returns:
        ``(offset, length)`` with ``sum(length over ranks) == count``.

    Raises:
        TypeError: for arguments that are not integers.
        ValueError: for a negative count, a non-positive nranks or a rank
        outside ``[0, nranks)``.
    """
    count, nranks = _check(count, nranks)
    rank = operator.index(rank)
    if not 0 <= rank < nranks:
        raise ValueError(f"rank {rank} outside [0, {nranks})")
    base, extra = divmod(count, nranks)
    return rank * base + min(rank, extra), base + (1 if rank < extra else 0)


def chunk_bounds(count, nranks):
    """Return the list of ``nranks + 1`` chunk boundaries of ``count`` elements.

    Chunk ``i`` is ``[bounds[i], bounds[i + 1])``; same rule as :func:`partition`.
    """
    count, nranks = _check(count, nranks)
    base, extra = divmod(count, nranks)
    return [i * base + min(i, extra) for i in range(nranks + 1)]
