"""The reduction kernels in place and out of place, against a single-loop kernel.

    python benchmarks/kernels/in_place.py                # 64K elements: in L2
    python benchmarks/kernels/in_place.py --count 1e6    # from memory

Every reduction calls its kernel in place for all passes after the first
(``kernel(acc, x, acc)``).  LLVM vectorises an element-wise loop only behind
a runtime check that the output does not overlap an input, which an
in-place call fails, so a kernel written as one loop runs its scalar
fallback there.  ``pycollective.data.kernels`` writes each native kernel as
three loops (``out`` is ``a``, ``out`` is ``b``, neither).  This prints, per
op and dtype, the time per call of each form for the library's kernel and
for the same operation written as one loop (how the kernels were before),
and checks that all forms give the same bits.  One process, no MPI.
"""

import argparse
import math
import time

import numba
import numpy as np

from pycollective.data.kernels import get_kernel
from pycollective.bench._units import count_arg


@numba.njit(nogil=True)
def _one_loop_sum(a, b, out):
    for i in range(out.shape[0]):
        out[i] = a[i] + b[i]


@numba.njit(nogil=True)
def _one_loop_prod(a, b, out):
    for i in range(out.shape[0]):
        out[i] = a[i] * b[i]


@numba.njit(nogil=True)
def _one_loop_max(a, b, out):
    for i in range(out.shape[0]):
        x = a[i]
        y = b[i]
        if y > x or y != y:
            x = y
        elif y == x and x == 0 and math.copysign(1.0, y) > 0:
            x = y
        out[i] = x


@numba.njit(nogil=True)
def _one_loop_min(a, b, out):
    for i in range(out.shape[0]):
        x = a[i]
        y = b[i]
        if y < x or y != y:
            x = y
        elif y == x and x == 0 and math.copysign(1.0, y) < 0:
            x = y
        out[i] = x


ONE_LOOP = {"sum": _one_loop_sum, "prod": _one_loop_prod, "max": _one_loop_max,
            "min": _one_loop_min}


def per_call(kernel, args, seconds):
    """Median over 5 samples of the time per call, each sample about ``seconds`` / 5."""
    kernel(*args)
    t0 = time.perf_counter()
    kernel(*args)
    one = max(time.perf_counter() - t0, 1e-7)
    calls = max(1, int(seconds / 5 / one))
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(calls):
            kernel(*args)
        samples.append((time.perf_counter() - t0) / calls)
    return float(np.median(samples))


def forms(kernel, a, b, seconds):
    """Times of (out of place, out is a, out is b), and whether their bits agree."""
    out, x, y = np.empty_like(a), a.copy(), b.copy()
    with np.errstate(all="ignore"):
        times = (per_call(kernel, (a, b, out), seconds),
                 per_call(kernel, (x, b, x), seconds),
                 per_call(kernel, (a, y, y), seconds))
        # The timing loops folded b into x and y many times: check one call of each.
        expected = np.empty_like(a)
        kernel(a, b, expected)
        x[...] = a
        kernel(x, b, x)
        y[...] = b
        kernel(a, y, y)
    same = x.tobytes() == expected.tobytes() and y.tobytes() == expected.tobytes()
    return times, same


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--count", type=count_arg, default=65536, help="elements (65536: in L2)")
    p.add_argument("--dtypes", nargs="+", default=["float32", "float64", "int32"])
    p.add_argument("--seconds", type=float, default=0.1, help="time per form (0.1)")
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    print(f"{args.count} elements; us per call: out of place / out is a / out is b")
    print(f"{'dtype':<8} {'op':<5} {'pycollective':>24} {'one loop':>24}  same bits")
    for dt in args.dtypes:
        dtype = np.dtype(dt)
        a = (rng.standard_normal(args.count) * 10).astype(dtype)
        b = (rng.standard_normal(args.count) * 10).astype(dtype)
        for op, one_loop in ONE_LOOP.items():
            ours, same = forms(get_kernel(op, dtype), a, b, args.seconds)
            theirs, _ = forms(one_loop, a, b, args.seconds)
            fmt = "/".join(f"{t * 1e6:.1f}" for t in ours)
            ref = "/".join(f"{t * 1e6:.1f}" for t in theirs)
            print(f"{dt:<8} {op:<5} {fmt:>24} {ref:>24}  {'yes' if same else 'NO'}")


if __name__ == "__main__":
    main()
