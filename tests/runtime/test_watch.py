"""How a call is named in error messages: describe() reads each collective's fingerprint."""

import numpy as np

import pycollective  # noqa: F401  (registers the algorithms whose names describe() prints)
from pycollective.runtime import settings as _settings, watch as _watch
from pycollective.data.kernels import SUPPORTED_DTYPES


def _settings_of(timeout):
    return _settings.Settings(check=True, timeout=timeout, stall_warn=None, segment_bytes=1 << 20)


def test_allreduce_names_dtype_op_and_algorithm():
    code = SUPPORTED_DTYPES.index(np.dtype("float32"))
    fp = _watch.fingerprint("allreduce", 10, code, 3, 0, _settings_of(2.5))
    text = _watch.describe(fp)
    assert text.startswith("allreduce(count=10, dtype=float32, ")
    assert "op=min" in text and "algorithm=ring" in text and "timeout=2.5 s" in text


def test_gathers_show_an_itemsize_and_bcast_bytes():
    for what in ("allgather", "allgatherv"):
        text = _watch.describe(_watch.fingerprint(what, 12, 4, -1, 0, _settings_of(None)))
        assert text.startswith(f"{what}(count=12, itemsize=4,"), text
        assert "op=" not in text and "timeout=none" in text
    text = _watch.describe(_watch.fingerprint("bcast", 4096, -1, -1, 0, _settings_of(1.0)))
    assert text.startswith("bcast(bytes=4096,") and "dtype" not in text, text


def test_no_fingerprint():
    assert _watch.describe(()) == "(invalid arguments)"
