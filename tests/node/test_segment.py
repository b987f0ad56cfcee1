"""pycollective.node.segment on one process: both ways of sharing, and nothing left behind.

The node's other ranks are stood in for by the two callables ``share`` takes
(``bcast`` returns rank 0's value, ``all_ok`` the flags' AND); the MPI suites
run the same code across ranks.
"""

import glob
import os

import numpy as np
import pytest

from pycollective.node import segment as _segment
from pycollective.node.segment import Segment


def _leftovers():
    return glob.glob(f"/dev/shm/pycollective-{os.getpid()}-*")


def _share(nbytes):
    return Segment.share(nbytes, rank=0, bcast=lambda value: value, all_ok=lambda flag: flag)


def _no_memfd(monkeypatch):
    def refuse(*args):
        raise OSError("memfd_create refused")
    monkeypatch.setattr(_segment.os, "memfd_create", refuse, raising=False)


@pytest.mark.parametrize("by_name", [False, True], ids=["memfd", "posix-name"])
@pytest.mark.parametrize("nbytes", [0, 1, 4097])
def test_a_segment_is_whole_pages_of_zeros_and_leaves_no_name(by_name, nbytes, monkeypatch):
    """Without memfd (or where /proc cannot open it) the POSIX name is the way."""
    if by_name:
        _no_memfd(monkeypatch)
    seg = _share(nbytes)
    assert seg.nbytes >= max(nbytes, 8) and seg.nbytes % os.sysconf("SC_PAGESIZE") == 0
    words = seg.words()
    assert not words.any()
    words[-1] = 7  # writable to the last word
    assert seg.bytes()[-8:].view(np.int64)[0] == 7
    assert _leftovers() == []


def test_a_name_that_cannot_be_sized_is_removed(monkeypatch):
    """/dev/shm full: shm_open creates the name, ftruncate fails.  The share raises
    (every rank: no rank has memory) and the created name is gone."""
    def full(fd, length):
        raise OSError(28, "No space left on device")
    _no_memfd(monkeypatch)
    monkeypatch.setattr(_segment.os, "ftruncate", full)
    with pytest.raises(OSError, match="cannot share memory"):
        _share(100)
    assert _leftovers() == []
