"""Parameters from the lecture, shared by the model's tests."""

import pytest

LECTURE_PARAMS = dict(alpha=5e-6, w=5e-11)  # tables 7 and 8, w per element as printed
EX1 = dict(alpha=5e-6, w=4 / 12.5e9)        # exercise 1: fp32 at 12.5 GB/s
LECTURE_BYTES = dict(alpha=5e-6, beta=5e-11 / 2, gamma=0.0)  # fp16 elements, itemsize 2


def quoted(value, digits_after_point, unit=1.0):
    """pytest.approx for a number the lecture printed with a given rounding."""
    return pytest.approx(value * unit, abs=0.5 * 10 ** -digits_after_point * unit)
