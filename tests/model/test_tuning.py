"""Self-tuning bookkeeping (pycollective.model.tuning): candidates, rounds, pruning, decisions."""

import json

import pytest

from pycollective.model import tuning
from pycollective.model.tuning import Decision, Tuner

RANKING = [("shm", 1e-5), ("butterfly", 1.2e-5), ("ring", 2e-5), ("naive", 3e-5)]


def _run(tuner, times_of, warmup=None):
    """Feed ``tuner`` its warm-up round (``warmup``: per-candidate times, default far
    slower than any timed one, so that counting them would change every decision),
    then the given per-candidate times, round by round, until it decides; the calls.
    Where the tuner runs bursts, every call of a candidate's burst takes its time."""
    order = []
    while tuner.decision is None:
        name = tuner.next()
        order.append(name)
        if tuner.ran():
            if tuner.round < tuning.WARMUP:
                per = [(warmup or {}).get(n, 1000.0) for n in tuner.alive]
            else:
                per = [times_of[n][tuner.round - tuning.WARMUP] for n in tuner.alive]
            tuner.feed([t for t in per for _ in range(tuner.burst)])
    return order


def test_size_classes_are_octaves_of_bytes():
    assert tuning.size_class(0) == 0
    assert [tuning.size_class(b) for b in (1, 2, 3, 4, 7, 8)] == [1, 2, 2, 3, 3, 4]
    for k in range(1, 40):
        lo, hi = tuning.class_bounds(k)
        assert tuning.size_class(lo) == tuning.size_class(hi) == k
        assert tuning.size_class(hi + 1) == k + 1


def test_rounds_grow_for_short_calls_within_the_stated_bounds():
    assert tuning.rounds_for(1.0) == tuning.rounds_for(tuning.SHORT_CALL) == tuning.MIN_ROUNDS
    assert tuning.rounds_for(1e-6) == tuning.MAX_ROUNDS
    values = [tuning.rounds_for(10 ** -e) for e in range(2, 8)]
    assert values == sorted(values)
    assert all(tuning.MIN_ROUNDS <= v <= tuning.MAX_ROUNDS for v in values)


def test_tuner_tries_the_model_s_best_few_in_order_and_keeps_the_fastest():
    tuner = Tuner(RANKING, count=1000, rounds=3)
    assert tuner.alive == ["shm", "butterfly", "ring"]  # CANDIDATES = 3, model order
    # naive's prediction is 3x the best: the model can tell it apart
    times = {"shm": [5, 5, 5], "butterfly": [4, 4.1, 3.9], "ring": [4.5, 4.4, 4.6]}
    order = _run(tuner, times)
    assert order[::tuner.burst][:3] == ["shm", "butterfly", "ring"]
    d = tuner.decision
    assert d.algorithm == "butterfly" and d.how == "tuned" and d.count == 1000
    assert d.calls == len(order) == tuning.CANDIDATES * (tuning.WARMUP + 3) * tuner.burst
    assert d.times["butterfly"] == 4  # the lower median of 4, 4.1, 3.9


def test_a_first_slow_call_does_not_decide():
    # The first call of an algorithm builds its state (windows, communicators).
    tuner = Tuner(RANKING[:2], count=10, rounds=3)
    _run(tuner, {"shm": [90, 1, 1], "butterfly": [2, 2, 2]})
    assert tuner.decision.algorithm == "shm"


def test_two_slow_first_calls_neither_drop_nor_decide():
    # Measured (2026-12-01, 4 ranks on 2 cores, 1000 floats): shm's first trial
    # built its slots (7 ms), its second loaded compiled code (28 ms), later
    # ones took 0.1 ms, butterfly 0.15 ms.  Without the warm-up round shm was
    # dropped after two rounds.
    tuner = Tuner(RANKING[:2], count=10, rounds=3)
    _run(tuner, {"shm": [28, 0.1, 0.1], "butterfly": [0.15, 0.15, 0.15]},
         warmup={"shm": 7, "butterfly": 4})
    assert tuner.decision.algorithm == "shm"
    assert tuner.decision.times == {"shm": 0.1, "butterfly": 0.15}


def test_slow_candidates_are_dropped_once_they_have_two_timed_calls():
    # bursts: two timed calls per round; single calls: one
    tuner = Tuner(RANKING, count=10, rounds=5)
    order = _run(tuner, {"shm": [1] * 5, "butterfly": [1.1] * 5, "ring": [9] * 5})
    assert tuner.burst > 1 and order.count("ring") == (tuning.WARMUP + 1) * tuner.burst
    assert order.count("shm") == (tuning.WARMUP + 5) * tuner.burst
    assert "ring" not in tuner.decision.times
    assert tuner.decision.algorithm == "shm"
    tuner = Tuner(RANKING, count=10, rounds=5, burst=1)
    order = _run(tuner, {"shm": [1] * 5, "butterfly": [1.1] * 5, "ring": [9] * 5})
    assert order.count("ring") == tuning.WARMUP + 2 and order.count("shm") == tuning.WARMUP + 5


def test_the_model_s_first_is_kept_through_its_first_timed_burst():
    # one burst slowed by another process; the rounds after show it is the fastest
    tuner = Tuner(RANKING[:2], count=10, rounds=3)
    _run(tuner, {"shm": [9, 1, 1], "butterfly": [2, 2, 2]})
    assert tuner.decision.algorithm == "shm"
    # any other candidate is dropped after its first timed burst
    tuner = Tuner(RANKING[:2], count=10, rounds=3)
    order = _run(tuner, {"shm": [1, 1, 1], "butterfly": [9, 1, 1]})
    assert order.count("butterfly") == (tuning.WARMUP + 1) * tuner.burst
    assert tuner.decision.algorithm == "shm"


def test_one_candidate_left_ends_the_tuning():
    tuner = Tuner(RANKING, count=10, rounds=7)
    order = _run(tuner, {"shm": [1] * 7, "butterfly": [5] * 7, "ring": [5] * 7})
    assert len(order) == 3 * (tuning.WARMUP + 1) * tuner.burst
    assert tuner.decision.algorithm == "shm"


def test_ties_go_to_the_model_s_order_and_the_result_is_deterministic():
    times = {"shm": [2, 2, 2], "butterfly": [2, 2, 2], "ring": [2, 2, 2]}
    decisions = []
    for _ in range(3):
        tuner = Tuner(RANKING, count=10, rounds=3)
        _run(tuner, times)
        decisions.append(tuner.decision)
    assert decisions[0] == decisions[1] == decisions[2] and decisions[0].algorithm == "shm"


def test_the_fastest_wins_even_when_the_model_ranks_it_last():
    # No margin for the model's order, short calls (bursts) or long: an uncalibrated
    # model can be far off, and the trials are what correct it.
    short = [("ring", 1e-5), ("butterfly", 1.2e-5), ("tree", 1.5e-5)]
    long = [(n, t * 1e5) for n, t in short]
    close = {"ring": [1.05] * 3, "butterfly": [1.06] * 3, "tree": [1.0] * 3}
    for ranking in (short, long):
        tuner = Tuner(ranking, count=10, rounds=3)
        _run(tuner, close)
        assert tuner.decision.algorithm == "tree", ranking[0]


def test_a_single_candidate_is_decided_without_trials():
    tuner = Tuner(RANKING[:1], count=10)
    assert tuner.decision == Decision("shm", "model", 10, {}, {"shm": 1e-5})


def test_tuning_cost_is_the_time_beyond_the_winner():
    tuner = Tuner(RANKING[:2], count=10, rounds=2, burst=1)
    _run(tuner, {"shm": [3, 3], "butterfly": [1, 1]}, warmup={"shm": 5, "butterfly": 2})
    d = tuner.decision  # the warm-up calls count in what tuning cost
    assert d.spent == 15 and d.calls == 6 and d.cost == 15 - 6 * 1
    assert "butterfly" in d.describe() and "6 calls" in d.describe()


def test_feed_checks_its_length():
    tuner = Tuner(RANKING, count=10, burst=1)
    with pytest.raises(ValueError, match="expected 3 times"):
        tuner.feed([1.0])
    tuner = Tuner(RANKING, count=10)  # 1e-5 s predicted: bursts
    with pytest.raises(ValueError, match=f"expected {3 * tuning.BURST} times"):
        tuner.feed([1.0] * 3)


def test_short_calls_come_in_bursts_and_only_their_second_half_counts():
    """Right after another algorithm a call is slower (measured at 4 ranks on 2 cores):
    of each burst, the calls after the switch settled are the samples."""
    assert tuning.burst_for(tuning.SHORT_CALL / 2) == tuning.BURST
    assert tuning.burst_for(tuning.SHORT_CALL) == 1 == tuning.burst_for(1.0)
    tuner = Tuner(RANKING[:2], count=10)
    assert tuner.burst == tuning.BURST and tuner.rounds == (tuning.MAX_ROUNDS + 1) // 2
    b = tuning.BURST
    # shm is slow right after the switch, butterfly is not but stays slower than shm
    # once settled: only the settled calls decide.
    shm_burst, butterfly_burst = [9.0] * (b // 2) + [1.0] * (b - b // 2), [1.4] * b
    while tuner.decision is None:
        order = []
        for k in range(2 * b):
            order.append(tuner.next())
            assert tuner.ran() == (k == 2 * b - 1)  # the round ends with the last burst
        assert order == ["shm"] * b + ["butterfly"] * b
        tuner.feed(shm_burst + butterfly_burst)
    assert tuner.decision.algorithm == "shm" and tuner.decision.times == {
        "shm": 1.0, "butterfly": 1.4}
    assert tuner.decision.calls == 2 * b * (tuning.WARMUP + tuner.rounds)


def test_a_round_of_bursts_fits_in_one_agreement_row():
    from pycollective.node import group as _shmem
    assert tuning.MAX_CANDIDATES * tuning.BURST <= _shmem._BOARD_WIDTH - 1


def test_decisions_file_round_trip(tmp_path):
    path = tmp_path / "sub" / "decisions.json"
    assert tuning.load_decisions(path) == {}
    d = Decision("hierarchical", "tuned", 1000, {"hierarchical": 1e-4, "ring": 2e-4},
                 {"hierarchical": 3e-4, "ring": 1e-4}, 9, 2e-3)
    tuning.save_decision(path, 4, (2, 2), 12, "float32", "sum", d)
    tuning.save_decision(path, 4, (2, 2), 13, "float32", "sum", d._replace(algorithm="ring"))
    tuning.save_decision(path, 4, (2, 2), 12, "float32", "sum", d._replace(algorithm="ring"))
    kept = tuning.load_decisions(path)
    assert len(kept) == 2  # the class 12 entry was replaced
    entry = kept[tuning.decision_key(4, (2, 2), 12, "float32", "sum")]
    assert entry["algorithm"] == "ring"
    assert entry["min_bytes"] == 2048 and entry["max_bytes"] == 4095
    assert entry["times_us"]["hierarchical"] == pytest.approx(100.0)


@pytest.mark.parametrize("content", ["{not json", "[]", json.dumps({"decisions": [1]}),
                                     json.dumps({"decisions": [{"nranks": 2}]})])
def test_a_bad_decisions_file_is_a_clear_error(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match="bad.json"):
        tuning.load_decisions(path)


def test_a_fourth_candidate_when_the_model_cannot_tell_it_from_the_best():
    close = [("ring", 1.0), ("rabenseifner", 1.0), ("ring_pipelined", 1.0), ("shm", 1.2),
             ("tree", 1.2)]
    assert [n for n, _ in tuning.candidates(close)] == ["ring", "rabenseifner",
                                                        "ring_pipelined", "shm"]
    apart = [("ring", 1.0), ("rabenseifner", 1.0), ("ring_pipelined", 1.0), ("shm", 2.0)]
    assert len(tuning.candidates(apart)) == 3
    assert tuning.candidates([("ring", 1.0)]) == [("ring", 1.0)]
    assert tuning.MAX_TRIALS == tuning.MAX_CANDIDATES * max(
        tuning.WARMUP + tuning.MAX_ROUNDS,
        tuning.BURST * (tuning.WARMUP + (tuning.MAX_ROUNDS + 1) // 2))


def test_layout_aware_algorithms_are_always_candidates():
    ranking = [("ring", 1.0), ("tree", 1.1), ("butterfly", 1.2), ("ps", 1.24), ("shm", 9.0),
               ("hierarchical", 20.0)]
    chosen = [n for n, _ in tuning.candidates(ranking, always=["shm", "hierarchical", "gone"])]
    # the model's three best, the tie (ps: within 1.25x) and both layout-aware ones, at most 5,
    # the layout-aware ones first, all in the model's order
    assert chosen == ["ring", "tree", "butterfly", "shm", "hierarchical"]
    assert [n for n, _ in tuning.candidates(ranking)] == ["ring", "tree", "butterfly", "ps"]
    # already among the best: not twice
    assert [n for n, _ in tuning.candidates(ranking[:3] + [("shm", 9.0)], always=["ring"])] == [
        "ring", "tree", "butterfly"]
    tuner = tuning.Tuner(ranking, 1000, always=["hierarchical"])
    assert tuner.alive == ["ring", "tree", "butterfly", "ps", "hierarchical"]


@pytest.mark.parametrize("nodes", [(8,), (4, 4), (2, 3, 3)])
def test_auto_times_hierarchical_whatever_the_model_says_only_across_nodes(nodes):
    # On one node "hierarchical" is shm's node steps plus a whole-vector gather and
    # copy: auto leaves it to the model's ranking there; "shm" it times on any layout.
    import numpy as np

    import pycollective.algorithms  # noqa: F401  (registers them)
    from pycollective.collectives import auto as _auto
    from pycollective.model.params import builtin_params
    from pycollective.model.topology import Layout

    layout = Layout(nodes, True, tuple(2 for _ in nodes), 2 << 20)
    always = _auto._layout_aware(layout)
    assert ("hierarchical" in always) == (len(nodes) > 1), always
    assert "shm" in always
    state = _auto.AutoState(builtin_params("test"), sum(nodes), (), layout)
    ranking = state.ranking(10_000_000, np.dtype(np.float32))
    assert ranking[0][0] != "hierarchical"  # else the model alone would time it
    trying = state.explain(10_000_000, np.float32, "sum")[-1]
    assert ("'hierarchical'" in trying) == (len(nodes) > 1), trying


def test_a_tuned_decision_prices_nearby_sizes_from_its_trials():
    # The first-use measurement prices shm by measured ratios up to 9 MiB and holds the
    # last one beyond; auto's trials at 4 MB put their own ratio in, so 40 MB is priced
    # from the 4 MB call the job just timed.  Algorithms the model prices by the bare
    # α-β-γ cost (no measured ratios) are left as they are; every rank gets the same.
    import numpy as np

    import pycollective.algorithms  # noqa: F401  (registers them)
    from pycollective.collectives import auto as _auto
    from pycollective.model.choice import LEARN_SPAN, learned
    from pycollective.model.params import builtin_params
    from pycollective.model.topology import Layout

    params = builtin_params("test")
    shm_curve = [[8.0, 0.2], [4096.0, 0.2], [65536.0, 0.3], [1048576.0, 1.0], [9437184.0, 1.0]]
    params = {**params, "corrections": {"shm": shm_curve}}
    state = _auto.AutoState(params, 2, (), Layout((2,), True, (2,), 2 << 20))
    f32 = np.dtype(np.float32)
    before = dict(state.ranking(10_000_000, f32))
    count = 1_000_000
    shm_before = dict(state.ranking(count, f32))["shm"]
    measured = {"shm": 1.5 * shm_before, "ring": 3.0 * shm_before}
    state._decide(state.key(count, f32, "sum"), f32,
                  Decision("shm", "tuned", count, measured, {}, 12, 1.0))
    after = dict(state.ranking(10_000_000, f32))
    assert dict(state.ranking(count, f32))["shm"] == pytest.approx(measured["shm"])
    assert after["shm"] == pytest.approx(1.5 * before["shm"], rel=0.02)  # held from 4 MB
    assert after["ring"] == before["ring"]  # no measured ratios: its bare cost stays
    curve = state.flat["learned"]["shm"]
    assert [x for x, _ in curve] == [8.0, 4096.0, 65536.0, 4e6]  # 1 and 9 MiB within 4x
    assert all(not 4e6 / LEARN_SPAN < x < 4e6 * LEARN_SPAN for x, _ in curve[:-1])
    # pure, and the same for the same agreed times
    again = learned(state.flat, 2, count, f32, measured)
    assert again["learned"] == state.flat["learned"] and again is not state.flat
    # a decision of the model or from a file has no trials: nothing learned
    kept = state.flat
    state._decide(state.key(5, f32, "sum"), f32, Decision("ring", "model", 5))
    assert state.flat is kept


def test_small_trials_are_not_learned_from():
    # a small call's trial time carries the switches between candidates
    import numpy as np

    from pycollective.model.choice import LEARN_FROM, learned
    from pycollective.model.params import builtin_params, params_for

    flat = params_for({**builtin_params("test"), "corrections": {"shm": [[8.0, 0.2]]}}, 2)
    f32 = np.dtype(np.float32)
    assert learned(flat, 2, LEARN_FROM // 4, f32, {"shm": 1.0}) is flat
    assert learned(flat, 2, LEARN_FROM // 4 + 1, f32, {"shm": 1.0})["learned"]["shm"][-1][0] \
        == LEARN_FROM + 4


def _run_calls(tuner, time_of):
    """Feed ``tuner`` until it decides, each call's time ``time_of(name, k)`` for the
    candidate's k-th call (from 1); the number of calls."""
    made = {}
    pending = []
    while tuner.decision is None:
        name = tuner.next()
        made[name] = made.get(name, 0) + 1
        pending.append(time_of(name, made[name]))
        if tuner.ran():
            tuner.feed(pending)
            pending = []
    return made


def _shm_with_ways(name, k):
    # Measured (2026-12-07, N = 2 on the Intel VM, 1e6 floats, ms): shm's first calls of
    # a size build its two ways and then time them in turn (10 calls: 6.9, 10.4, 1.0,
    # 4.0, 4.7, 1.3, 1.8, 1.6, ...), after which it took 0.55-0.6; ring 0.69-0.73,
    # rabenseifner 0.63-0.65, ring_pipelined 0.66-0.67.  Without counting the ways'
    # calls out, shm was dropped after its first timed burst.
    if name == "shm":
        return [6.9, 10.4, 1.0, 4.0, 4.7, 1.3, 1.8, 1.6, 1.5, 1.4][k - 1] if k <= 10 else 0.58
    return {"ring": 0.71, "rabenseifner": 0.64, "ring_pipelined": 0.665}[name]


LARGE = [("ring", 6e-4), ("rabenseifner", 6.2e-4), ("ring_pipelined", 6.3e-4), ("shm", 6.5e-4)]


def test_a_candidate_timing_ways_of_its_own_is_timed_after_them():
    unsettled = Tuner(LARGE, count=10**6, always=["shm"])
    _run_calls(unsettled, _shm_with_ways)
    assert "shm" not in unsettled.decision.times  # dropped on its ways' calls
    tuner = Tuner(LARGE, count=10**6, always=["shm"], settle={"shm": 10})
    made = _run_calls(tuner, _shm_with_ways)
    assert tuner.decision.algorithm == "shm" and tuner.decision.times["shm"] == 0.58
    assert made["shm"] > 10
    # every timed call of shm came after its tenth (none of the ways' times counted)
    assert set(tuner.samples["shm"]) == {0.58} and len(tuner.samples["shm"]) >= 2


def test_settling_calls_keep_the_rounds_going_only_for_the_candidate_settling():
    # long calls (one per round): the candidate's settling calls are untimed rounds
    tuner = Tuner(LARGE, count=10**7, rounds=2, always=["shm"], settle={"shm": 5}, burst=1)
    made = _run_calls(tuner, lambda name, k: 1.0 if name == "shm" and k <= 5 else
                      (0.5 if name == "shm" else 0.6))
    assert tuner.decision.algorithm == "shm"
    assert made["shm"] == 7  # five settling calls, then its two timed ones
    assert len(tuner.samples["shm"]) == 2
    # the others served their warm-up and timed rounds only: the rounds after them
    # were shm's alone
    assert all(made[n] == tuning.WARMUP + 2 for n in made if n != "shm"), made
