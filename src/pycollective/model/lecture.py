"""The lecture's textbook formulas and worked examples, kept so its numbers can be reproduced.

The lecture the project grew from (section 2.3 table 1, section 4.4 and its
program ``allreduce_model.c``, exercise 1) writes ``w`` for the transfer
time of one element:

=========  ===========================  =====================================
name       lecture                      implemented (``predict``, γ = 0)
=========  ===========================  =====================================
ring       2(N-1)(α + (M/N)·w)          same, with ceil(M/N)
tree       2·ceil(log2 N)·(α + M·w)     same
butterfly  ceil(log2 N)·(α + M·w)       (log2 p + 2·[N≠p])(α + M·w), p = 2^floor(log2 N)
ps         N·M·w + 2α                   2(N-1)(α + M·w)
naive      (N-1)·M·w + α                (N-1)(α + M·w)
=========  ===========================  =====================================

Units.  The lecture's tables 7 and 8 use ``w = 5e-11`` s per element, which
its text calls "fp16 at 10 GB/s"; but 2 bytes at 10 GB/s take 2e-10 s (its
C program divides the time per byte by the bytes per element instead of
multiplying).  Nothing here converts implicitly: pass ``w`` directly
(``--w 5e-11`` reproduces the tables), or bytes per element and bandwidth,
from which ``w = bytes / bandwidth``.  Exercise 1 (fp32 at 12.5 GB/s,
w = 3.2e-10 s) is consistent either way.
"""

import math

__all__ = ["LECTURE", "lecture_predict", "lecture_cases"]


LECTURE = {
    # name: (formula in the lecture's words, f(M, N, w, alpha))
    "ring": ("2(N-1)(a + (M/N)w)",
             lambda M, N, w, a: 2.0 * (N - 1) * (a + (M / N) * w)),
    "tree": ("2 ceil(log2 N)(a + Mw)",
             lambda M, N, w, a: 2.0 * math.ceil(math.log2(N)) * (a + M * w)),
    "butterfly": ("ceil(log2 N)(a + Mw)",
                  lambda M, N, w, a: math.ceil(math.log2(N)) * (a + M * w)),
    "ps": ("NMw + 2a", lambda M, N, w, a: N * M * w + 2 * a),
    "naive": ("(N-1)Mw + a", lambda M, N, w, a: (N - 1) * M * w + a),
}


def lecture_predict(algorithm, nranks, count, *, alpha, w):
    """The lecture's textbook time for ``algorithm`` (its ``allreduce_model.c``).

    Args:
        algorithm: one of "ring", "tree", "butterfly", "ps", "naive".
        nranks: N (>= 1); the lecture's tables use powers of two.
        count: M elements (float, as in the lecture: 1.5e9 is fine).
        alpha: seconds per step.
        w: seconds to transfer one element (not one byte).

    Returns:
        Seconds (float).

    Raises:
        ValueError: for a name the lecture has no formula for, or N < 1.
    """
    try:
        formula = LECTURE[algorithm][1]
    except KeyError:
        raise ValueError(f"the lecture has no formula for {algorithm!r}; "
                         f"it has: {', '.join(LECTURE)}") from None
    if nranks < 1:
        raise ValueError(f"nranks must be >= 1, got {nranks}")
    return float(formula(float(count), int(nranks), float(w), float(alpha)))


def lecture_cases():
    """The lecture's worked examples: ``[(title, M, w, alpha, Ns, quoted)]``.

    ``quoted`` maps (algorithm, N) to the time in seconds the lecture states.
    """
    return [
        ("table 7: M = 1.5e9, w = 5e-11 s/element (the lecture's 'fp16 at 10 GB/s'), "
         "alpha = 5 us", 1.5e9, 5e-11, 5e-6, [2 ** k for k in range(1, 11)],
         {("ring", 8): 0.131, ("ring", 1024): 0.160, ("ps", 1024): 76.8}),
        ("table 8: M = 1e6, w = 5e-11 s/element, alpha = 5 us",
         1e6, 5e-11, 5e-6, [2 ** k for k in range(1, 11)],
         {("butterfly", 1024): 0.55e-3, ("ring", 1024): 10.33e-3}),
        ("exercise 1: M = 4e6 fp32 at 12.5 GB/s (w = 3.2e-10 s/element), alpha = 5 us",
         4e6, 4 / 12.5e9, 5e-6, [512],
         {("ring", 512): 7.7e-3, ("butterfly", 512): 11.6e-3, ("tree", 512): 23.1e-3}),
    ]
