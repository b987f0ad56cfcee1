"""The lecture's ZeRO ledger (pycollective.model.ledger): table 3 and worked example 4.5."""

import pytest

from pycollective.algorithms.ring import ring_cost
from pycollective.model.ledger import (call_time, collectives_per_iteration, memory_per_rank,
                                       ring_sent, stage_comm_time, traffic_per_rank,
                                       worked_example_4_5)
from _cases import quoted


def test_worked_example_4_5_is_reproduced():
    """M = 175e9, N = 64, 50 GB/s, 125 TFLOP/s, T = 3.2e6: the numbers the lecture prints."""
    ex = worked_example_4_5()
    assert ex.memory_gb[0] == quoted(3500, 0)          # "3500 GB/卡"
    assert ex.memory_gb[1] == quoted(743.8, 1)         # "700 + 2800/64 = 743.8 GB"
    assert ex.memory_gb[2] == quoted(399.2, 1)         # "350 + 18x175/64 ≈ 399.2 GB"
    assert ex.memory_gb[3] == quoted(54.7, 1)          # "3500/64 = 54.7 GB"
    assert ex.traffic_gb[0] == ex.traffic_gb[1] == ex.traffic_gb[2] == quoted(700, 0)
    assert ex.traffic_gb[3] == quoted(1050, 0)
    assert ex.comm_s == quoted(14, 0)                  # "700 GB / 50 GB/s = 14 s"
    assert ex.compute_s == quoted(420, 0)              # "= 420 s"
    assert 100 * ex.comm_share == quoted(3.3, 1)       # "14 s / 420 s = 3.3%"
    # "T = 8192: 1.07 s": 6 x 175e9 x 8192 / 8e15 = 1.0752 s, which the lecture truncates
    assert ex.small_batch_compute_s == pytest.approx(1.0752) and int(ex.small_batch_compute_s * 100) == 107
    assert 100 * ex.small_batch_comm_share == quoted(93, 0)  # "通信占比 93%"
    assert ex.crossover_tokens == pytest.approx(1.07e5, rel=5e-3)  # "≈ 1.07×10^5 token"


def test_exercise_2_turing_nlg_on_8_gpus():
    """Exercise 2: 17.2e9 parameters on 8 GPUs: 344, 103.2, 73.1, 43 GB per GPU."""
    m, n = 17.2e9, 8
    got = [memory_per_rank(s, m, n)["total"] / 1e9 for s in range(4)]
    assert got == [quoted(344, 0), quoted(103.2, 1), quoted(73.1, 1), quoted(43, 0)]


@pytest.mark.parametrize("n", [1, 2, 3, 8, 64])
def test_memory_formulas(n):
    m = 1000.0
    assert memory_per_rank(0, m, n)["total"] == 20 * m
    assert memory_per_rank(1, m, n)["total"] == pytest.approx(4 * m + 16 * m / n)
    assert memory_per_rank(2, m, n)["total"] == pytest.approx(2 * m + 18 * m / n)
    assert memory_per_rank(3, m, n)["total"] == pytest.approx(20 * m / n)
    fp32 = memory_per_rank(0, m, n, working_bytes=4)
    assert (fp32["params"], fp32["grads"], fp32["optimizer"]) == (4 * m, 4 * m, 16 * m)
    with pytest.raises(ValueError, match="stage"):
        memory_per_rank(4, m, n)


@pytest.mark.parametrize("count", [0, 1, 5, 7, 64, 1001])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 7])
def test_ring_schedules_send_all_but_one_chunk(count, n):
    """Over all ranks a ring reduce-scatter (or allgather) sends (N-1) copies of the vector."""
    for collective in ("reduce_scatter", "allgather"):
        assert sum(ring_sent(collective, count, n, r) for r in range(n)) == (n - 1) * count
    assert sum(ring_sent("allreduce", count, n, r) for r in range(n)) == 2 * (n - 1) * count
    if count % n == 0:
        assert {ring_sent("allreduce", count, n, r) for r in range(n)} == {
            traffic_per_rank(0, count, n)}


def test_traffic_and_calls_per_stage():
    assert traffic_per_rank(0, 800, 8) == traffic_per_rank(2, 800, 8) == 1400
    assert traffic_per_rank(3, 800, 8) == 2100
    assert collectives_per_iteration(0, [3, 4]) == [("allreduce", 3), ("allreduce", 4)]
    assert collectives_per_iteration(3, [3]) == [("allgather", 3), ("allgather", 3),
                                                 ("reduce_scatter", 3)]


def test_stage_time_is_the_rings_halves():
    kw = dict(alpha=3e-6, beta=1e-10, gamma=1e-10)
    layers = [1000, 17]
    ring = sum(ring_cost(4, m, 2, *kw.values()) for m in layers)
    assert stage_comm_time(0, layers, 4, 2, **kw) == pytest.approx(ring)
    assert stage_comm_time(1, layers, 4, 2, **kw) == pytest.approx(ring)
    assert stage_comm_time(3, layers, 4, 2, **kw) > 1.4 * ring
    assert stage_comm_time(3, layers, 1, 2, **kw) == 0.0


def test_call_time_prices_each_ring_half():
    kw = dict(alpha=3e-6, beta=1e-10, gamma=2e-9)
    rs = call_time("reduce_scatter", 1001, 4, 2, **kw)
    ag = call_time("allgather", 1001, 4, 2, **kw)
    assert rs == pytest.approx(3 * (3e-6 + 251 * 2 * 1e-10) + 3 * 251 * 2 * 2e-9)
    assert ag == pytest.approx(3 * (3e-6 + 251 * 2 * 1e-10))
    assert call_time("allreduce", 1001, 4, 2, **kw) == pytest.approx(rs + ag)
    assert call_time("allreduce", 1001, 4, 2, **kw) == pytest.approx(ring_cost(4, 1001, 2,
                                                                               *kw.values()))
    assert call_time("allgather", 0, 4, 2, **kw) == call_time("allgather", 5, 1, 2, **kw) == 0
    with pytest.raises(ValueError, match="no ring schedule"):
        call_time("bcast", 5, 2, 2, **kw)
