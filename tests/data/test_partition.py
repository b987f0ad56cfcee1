import pytest

from pycollective import partition
from pycollective.data.partition import chunk_bounds


@pytest.mark.parametrize("nranks", [1, 2, 3, 4, 5, 7, 8, 16])
@pytest.mark.parametrize("count", [0, 1, 2, 3, 6, 7, 8, 9, 13, 1000, 10007])
def test_chunks_tile_the_vector(count, nranks):
    pieces = [partition(count, nranks, r) for r in range(nranks)]
    offset = 0
    for start, length in pieces:
        assert start == offset and length >= 0
        offset += length
    assert offset == count
    lengths = [length for _, length in pieces]
    assert max(lengths) - min(lengths) <= 1
    assert lengths == sorted(lengths, reverse=True)  # the extra elements go to the first ranks
    bounds = chunk_bounds(count, nranks)
    assert [(bounds[r], bounds[r + 1] - bounds[r]) for r in range(nranks)] == pieces


def test_fewer_elements_than_ranks():
    assert [partition(3, 5, r) for r in range(5)] == [(0, 1), (1, 1), (2, 1), (3, 0), (3, 0)]


def test_documented_rule():
    # 10 elements over 4 ranks: 3, 3, 2, 2
    assert [partition(10, 4, r) for r in range(4)] == [(0, 3), (3, 3), (6, 2), (8, 2)]


@pytest.mark.parametrize("args, exc", [
    ((-1, 4, 0), ValueError), ((10, 0, 0), ValueError), ((10, 4, 4), ValueError),
    ((10, 4, -1), ValueError), ((10.0, 4, 0), TypeError), ((10, 4, 1.5), TypeError),
])
def test_bad_arguments(args, exc):
    with pytest.raises(exc):
        partition(*args)
