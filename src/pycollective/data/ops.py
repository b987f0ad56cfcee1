"""Reduction ops: the one map between MPI ops and pycollective's op names."""

from typing import Optional

from mpi4py import MPI

__all__ = ["OPS", "MPI_OPS", "resolve_op", "predefined_name"]

#: The ops pycollective reduces itself, in the order used by the agreement step.
OPS = ("sum", "prod", "max", "min")

#: name -> MPI op, for the ops in :data:`OPS`.
MPI_OPS = {"sum": MPI.SUM, "prod": MPI.PROD, "max": MPI.MAX, "min": MPI.MIN}

# Every predefined MPI op by name, to say which one a fallback was for.
_PREDEFINED = tuple(
    (name, getattr(MPI, name))
    for name in ("SUM", "PROD", "MAX", "MIN", "LAND", "BAND", "LOR", "BOR", "LXOR", "BXOR",
                 "MAXLOC", "MINLOC", "REPLACE", "NO_OP")
    if hasattr(MPI, name))


def resolve_op(op) -> str:
    """Return the canonical name ("sum", "prod", "max", "min") of ``op``.

    Args:
        op: an ``MPI.Op`` or one of the names (any case).

    Raises:
        ValueError: for any other op (MPI op or string).
    """
    if isinstance(op, str):
        name = op.lower()
        if name in OPS:
            return name
    elif isinstance(op, MPI.Op):
        for name, mpi_op in MPI_OPS.items():  # MPI.Op is not hashable
            if op == mpi_op:
                return name
    raise ValueError(
        f"unsupported op {op!r}: pycollective implements MPI.SUM, MPI.PROD, "
        f"MPI.MAX, MPI.MIN (or 'sum', 'prod', 'max', 'min')")


def predefined_name(op) -> Optional[str]:
    """``"LAND"`` etc. for a predefined MPI op, None for a user-defined one."""
    for name, known in _PREDEFINED:
        if op == known:
            return name
    return None
