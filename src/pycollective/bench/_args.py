"""Argument types and options shared by the bench's commands."""

import argparse
import math

import numpy as np

from ..collectives import options as _opts
from ._exact import exact_values
from ..data.kernels import DTYPE_NAMES, as_dtype
from ..data.ops import MPI_OPS
from ._units import count_arg

__all__ = ["factor_arg", "seconds_arg", "positive_int", "add_data_options", "check_exact",
           "expand_algorithms", "add_algorithms_argument"]


def _float_arg(text, what, ok, rule):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a {what}") from None
    if not ok(value) or not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{rule}, got {text!r}")
    return value


def factor_arg(text):
    """argparse type: a number above 1."""
    return _float_arg(text, "number", lambda v: v > 1, "step factor must be a number above 1")


def seconds_arg(text):
    """argparse type: a positive number of seconds."""
    return _float_arg(text, "number of seconds", lambda v: v > 0,
                      "a time budget must be positive")


def positive_int(text):
    """argparse type: a whole number of at least 1 (``1e3`` allowed)."""
    value = count_arg(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} must be at least 1")
    return value


def add_data_options(p):
    """--dtype and --op, shared by the commands that time allreduce."""
    dtypes = list(DTYPE_NAMES)
    p.add_argument("--dtype", "-d", default="float32", choices=dtypes, metavar="DTYPE",
                   help=f"element type: {', '.join(dtypes)} (float32)")
    p.add_argument("--op", "-o", default="sum", choices=list(MPI_OPS), metavar="OP",
                   help="reduction: sum, prod, max, min (sum)")


def check_exact(parser, args, nranks):
    """An argument error when no exact data exist for this dtype, op and N."""
    try:
        exact_values(0, 1, 0, nranks, as_dtype(args.dtype), args.op)
    except ValueError as exc:
        parser.error(str(exc))


def expand_algorithms(names):
    """``all`` -> every registered algorithm; duplicates dropped, order kept."""
    names = [names] if isinstance(names, str) else names
    expanded = []
    for name in names:
        for n in (_opts.algorithms() if name == "all" else [name]):
            if n not in expanded:
                expanded.append(n)
    return expanded


def add_algorithms_argument(p, default="all"):
    """The positional ALGORITHM list; its choices come from the registry."""
    # "auto" times allreduce(algorithm="auto") itself (choice included); "all"
    # is every registered algorithm (not auto: it is one of them).
    choices = _opts.algorithms() + ["auto", "all"]
    # a string default: argparse checks a nargs="*" default against choices.
    p.add_argument("algorithms", nargs="*", metavar="ALGORITHM", choices=choices,
                   default=default,
                   help=f"algorithms to run: {', '.join(choices)} (default: {default}; all = "
                        "every registered algorithm; auto = what algorithm='auto' picks, timed "
                        "as the user would call it)")
