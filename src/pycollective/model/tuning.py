"""Self-tuning for ``algorithm="auto"``: which algorithms to time, and how to decide from the times.

The model ranks the algorithms; on a machine it has never measured, or
across nodes whose links it only guesses, its first choice can be far off.
So ``auto`` times the few it ranks best on the user's own calls before it
settles.  This module is the bookkeeping of that, and nothing else: it sends
no message and measures nothing.  :mod:`pycollective.collectives.auto` runs the trials
on the real communicator, each a complete, correct allreduce of the caller's
data, times them, agrees on the times across ranks (the slowest rank's) and
feeds the agreed times here, so every rank reaches the same decision.

Per (size class, dtype, op) -- a size class is one octave of bytes per
rank, ``[2^(k-1), 2^k)`` -- a :class:`Tuner`:

* takes the model's :data:`CANDIDATES` best (fewer if fewer can run), and
  one more when the model puts it within :data:`TIE` of its best: the bare
  model often cannot tell such algorithms apart (on one node several of them
  move the same bytes); and, whatever their rank, the algorithms registered
  as ``layout_aware`` (shared memory inside a node: their cost depends on how
  ranks share cores and links, which the bare model only guesses, and
  left out the fastest of them (docs/results/fold.md); an algorithm may say
  on which layouts this holds, ``hierarchical`` across nodes only); at most
  :data:`MAX_CANDIDATES` in all;
* runs rounds; in each round every candidate still in the race serves one
  call, in the model's order -- or, for calls the model predicts to take
  less than :data:`SHORT_CALL`, a burst of :data:`BURST` consecutive
  calls, of which only the second half is timed: right after another
  algorithm a call is slowed by what that one left, enough for single
  calls to keep the slower algorithm (docs/results/python.md#autos-trials-in-bursts).
  The round's times are agreed in one small MAX reduction at its end;
* ignores the times of the first :data:`WARMUP` round: a candidate's first
  call builds its state (windows, sub-communicators) and its second may
  still load compiled code, which once dropped the fastest candidate
  (docs/results/fold.md);
* once every candidate has two timed calls (after the first timed round
  of bursts, the second of single calls) drops the candidates slower than
  :data:`PRUNE` times the best so far (their best time against the best
  time; the model's first only from the second timed round on, so that
  one burst slowed by another process cannot drop it: trials of short
  calls cost the first calls of a shape 1.5-2x, docs/results/auto-score.md),
  and stops when one is left or after its timed rounds:
  :data:`MIN_ROUNDS` for calls the model predicts to take more than
  :data:`SHORT_CALL` seconds, up to :data:`MAX_ROUNDS` for shorter ones,
  whose timings are noisier and whose trials cost almost nothing (half as
  many rounds where they come in bursts);
* picks the candidate with the smallest lower median of its agreed times
  (ties: the model's order).  The lower median ignores any one call that
  another process slowed down.  No margin for the model's order: without
  a calibration its order can be far off, and a margin for it once kept an
  algorithm 10x slower per call (docs/results/python.md#autos-trials-in-bursts).

So a class costs at most :data:`MAX_TRIALS` = 100 trial calls of calls
under 1 ms (bursts of 4 over half as many rounds) and 20 for longer ones,
every one of them a useful allreduce; what tuning
costs is only the time the slower candidates took beyond the winner's, which
:class:`Decision` reports (``cost``).  Calls of another count of the same
class, made while a class is being tuned, run the model's first choice and
are not timed, so that only times of equal calls are compared.

Decisions can be kept in a JSON file and reloaded (``PYCOLLECTIVE_AUTO=FILE``):
:func:`load_decisions`, :func:`save_decision`.
"""

import json
import math
from typing import Dict, List, NamedTuple, Optional, Sequence, Tuple

from .params import read_text, write_json

__all__ = ["CANDIDATES", "MAX_CANDIDATES", "TIE", "WARMUP", "MIN_ROUNDS", "MAX_ROUNDS",
           "SHORT_CALL", "BURST", "burst_for",
           "PRUNE", "MAX_TRIALS", "candidates", "size_class",
           "class_bounds", "rounds_for", "Tuner", "Decision", "load_decisions",
           "save_decision", "decision_key"]

CANDIDATES = 3
MAX_CANDIDATES = 5
TIE = 1.25
WARMUP = 1
MIN_ROUNDS = 3
MAX_ROUNDS = 7
SHORT_CALL = 1e-3
PRUNE = 1.5
BURST = 4  # consecutive calls of a candidate per round, for calls under SHORT_CALL
# (a round's MAX_CANDIDATES * BURST times are agreed in one row of the node's board,
# node.group._BOARD_WIDTH = 24 int64: tests/model/test_tuning.py checks that they fit)


def _in_bursts(rounds: int) -> int:
    """Timed rounds of bursts instead of ``rounds`` of single calls: half as many (a burst
    gives two timed calls), rounded up."""
    return (rounds + 1) // 2


# Trial calls of one class, at most: bursts of BURST over half of MAX_ROUNDS, or MAX_ROUNDS
MAX_TRIALS = MAX_CANDIDATES * max(WARMUP + MAX_ROUNDS, BURST * (WARMUP + _in_bursts(MAX_ROUNDS)))


def candidates(ranking: Sequence[Tuple[str, float]], count: int = CANDIDATES,
               most: int = MAX_CANDIDATES, tie: float = TIE,
               always: Sequence[str] = ()) -> List[Tuple[str, float]]:
    """The model's ``count`` best, those in ``always`` it ranks at all, and the next one if
    predicted within ``tie`` of the best; at most ``most``, in the model's order."""
    ranking = list(ranking)
    if not ranking:
        return []
    best = ranking[0][1]
    count = max(1, count)
    chosen = ranking[:count]
    chosen += [(n, t) for n, t in ranking[count:] if n in always]
    chosen += [(n, t) for n, t in ranking[count:count + 1] if t <= tie * best and n not in always]
    order = {n: i for i, (n, _) in enumerate(ranking)}
    return sorted(chosen[:max(1, most)], key=lambda nt: order[nt[0]])


def size_class(nbytes: int) -> int:
    """The octave of ``nbytes``: class k holds ``[2^(k-1), 2^k)`` bytes (class 0: empty)."""
    return int(nbytes).bit_length()


def class_bounds(k: int) -> Tuple[int, int]:
    """Smallest and largest byte count of class ``k``."""
    return (0, 0) if k == 0 else (1 << (k - 1), (1 << k) - 1)


def rounds_for(predicted: float) -> int:
    """Rounds of trials for calls the model predicts to take ``predicted`` seconds."""
    if predicted >= SHORT_CALL:
        return MIN_ROUNDS
    if predicted <= SHORT_CALL / 10:
        return MAX_ROUNDS
    # in between, fewer rounds the longer the call
    share = math.log10(SHORT_CALL / predicted)  # 0 .. 1
    return MIN_ROUNDS + int(round(share * (MAX_ROUNDS - MIN_ROUNDS)))


def burst_for(predicted: float) -> int:
    """Consecutive calls of each candidate per round for calls predicted to take
    ``predicted`` seconds: :data:`BURST` under :data:`SHORT_CALL`, else 1."""
    return BURST if predicted < SHORT_CALL else 1


def _lower_median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[(len(ordered) - 1) // 2]


class Decision(NamedTuple):
    """What ``auto`` runs for one (size class, dtype, op), and why.

    Attributes:
        algorithm: the registered name.
        how: "tuned" (timed trials), "model" (the model's choice, no
            trials), or "file" (read from a decisions file).
        count: the count the trials ran at (0 if none).
        times: ``{candidate: agreed lower median, seconds}`` of the trials.
        predicted: ``{candidate: the model's prediction, seconds}``.
        calls: trial calls made.
        spent: total time of those calls (agreed, seconds).
    """

    algorithm: str
    how: str
    count: int = 0
    times: Dict[str, float] = {}
    predicted: Dict[str, float] = {}
    calls: int = 0
    spent: float = 0.0

    @property
    def cost(self) -> float:
        """Seconds the trials took beyond what as many calls of the winner take."""
        best = self.times.get(self.algorithm)
        return max(0.0, self.spent - self.calls * best) if best is not None else 0.0

    def describe(self) -> str:
        """One line: the choice and what it rests on."""
        if self.how != "tuned":
            source = "from the decisions file" if self.how == "file" else "the model"
            return f"{self.algorithm} ({source})"
        trials = ", ".join(f"{n} {self.times[n] * 1e6:.4g} us" if n in self.times else
                           f"{n} dropped" for n in self.predicted)
        return (f"{self.algorithm} (tuned at M={self.count}: {trials}; {self.calls} calls, "
                f"{self.cost * 1e6:.4g} us beyond the winner)")


class Tuner:
    """The trials of one (size class, dtype, op), fed the agreed time of each round.

    Args:
        ranking: ``[(name, predicted seconds)]`` fastest first (the model's).
        count: the element count the trials run at.
        rounds: timed rounds, after the :data:`WARMUP` one (default :func:`rounds_for` the
            best prediction, halved where calls come in bursts).
        always: names timed whenever the model ranks them (see :func:`candidates`).
        burst: consecutive calls of each candidate per round (default :func:`burst_for`
            the best prediction); the second half of each burst is timed.
        settle: ``{name: calls}``: a candidate's first calls that are not its steady ones
            (it times ways of its own on them: ``Algorithm.settling``).  They are not
            timed, the candidate is not dropped before it has two timed calls, and the
            rounds go on until every candidate left has them.
    """

    def __init__(self, ranking: Sequence[Tuple[str, float]], count: int,
                 rounds: Optional[int] = None, always: Sequence[str] = (),
                 burst: Optional[int] = None, settle: Optional[Dict[str, int]] = None):
        chosen = candidates(ranking, always=always)
        if not chosen:
            raise ValueError("nothing to tune: no candidate")
        self.count = int(count)
        self.predicted = dict(chosen)
        self.alive: List[str] = [name for name, _ in chosen]
        self.burst = burst_for(chosen[0][1]) if burst is None else max(1, int(burst))
        if rounds is None:
            rounds = rounds_for(chosen[0][1])
            if self.burst > 1:
                rounds = _in_bursts(rounds)
        self.rounds = max(1, int(rounds))
        self.samples: Dict[str, List[float]] = {name: [] for name in self.alive}
        self.settle = {n: int(c) for n, c in (settle or {}).items() if n in self.samples}
        self.made = {name: 0 for name in self.alive}  # calls of each candidate so far
        self.serving: List[str] = list(self.alive)  # the candidates of this round, in order
        self.round = 0
        self.position = 0
        self.calls = 0
        self.spent = 0.0
        self.decision: Optional[Decision] = None
        if len(self.alive) == 1:
            self.decision = Decision(self.alive[0], "model", self.count, {}, self.predicted)

    def next(self) -> str:
        """The candidate that serves the next trial call."""
        return self.serving[self.position // self.burst]

    def ran(self) -> bool:
        """Count one trial call; True when it ended a round (agree and :meth:`feed` now)."""
        self.position += 1
        self.calls += 1
        return self.position == len(self.serving) * self.burst

    def feed(self, agreed: Sequence[float]) -> Optional[Decision]:
        """The round's agreed times, one per call: each candidate's burst in turn, in order.

        Returns:
            The :class:`Decision` once the tuning is over, else None.
        """
        b = self.burst
        if len(agreed) != len(self.serving) * b:
            raise ValueError(f"expected {len(self.serving) * b} times, got {len(agreed)}")
        self.round += 1
        self.position = 0
        for i, name in enumerate(self.serving):
            burst = [float(t) for t in agreed[i * b:(i + 1) * b]]
            self.spent += sum(burst)
            made, self.made[name] = self.made[name], self.made[name] + b
            if self.round > WARMUP:
                # the calls after the switch settled (a burst's second half), and after the
                # candidate's own settling calls (burst[j] is its call made + j + 1)
                start = max(b // 2, self.settle.get(name, 0) - made)
                self.samples[name].extend(burst[start:])
        timed = self.round - WARMUP
        # prune among the candidates with two timed calls (a burst's second half per round),
        # but the model's first only from the second timed round: one burst that another
        # process slowed must not drop what the model and the rounds after might keep
        sampled = [n for n in self.alive if len(self.samples[n]) >= 2]
        if timed >= 1 and sampled and len(self.alive) > 1:
            best = min(min(self.samples[n]) for n in sampled)
            first = next(iter(self.predicted)) if timed < 2 else None
            self.alive = [n for n in self.alive
                          if n == first or n not in sampled or min(self.samples[n]) <= PRUNE * best]
        # a candidate still settling keeps the rounds going (at most its settling calls
        # more), and once the others have their rounds only it serves them
        settling = [n for n in self.alive if len(self.samples[n]) < 2]
        self.serving = settling if timed >= self.rounds and settling else list(self.alive)
        if (timed >= self.rounds and not settling) or (timed >= 1 and len(self.alive) == 1):
            order = {name: i for i, name in enumerate(self.predicted)}
            stats = {n: _lower_median(self.samples[n]) for n in self.predicted if self.samples[n]}
            winner = min(self.alive, key=lambda n: (stats.get(n, float("inf")), order[n]))
            times = {n: stats[n] for n in self.alive if n in stats}
            self.decision = Decision(winner, "tuned", self.count, times, self.predicted,
                                     self.calls, self.spent)
        return self.decision


# --- decisions kept in a file ------------------------------------------------------------------

_VERSION = 1


def decision_key(nranks: int, nodes: Sequence[int], klass: int, dtype: str, op: str) -> tuple:
    """What a kept decision applies to: the communicator's shape and the call's."""
    return (int(nranks), tuple(int(n) for n in nodes), int(klass), str(dtype), str(op))


def _entry_key(entry, where):
    try:
        key = decision_key(entry["nranks"], entry["nodes"], entry["class"], entry["dtype"],
                           entry["op"])
        if not isinstance(entry["algorithm"], str):
            raise TypeError
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"{where}: each decision needs nranks, nodes, class, dtype, op and "
                         "algorithm") from None
    return key


def load_decisions(path) -> Dict[tuple, dict]:
    """``{decision_key: entry}`` from a decisions file; ``{}`` if it does not exist.

    Raises:
        ValueError: a file that is not a decisions file (the message names it).
    """
    try:
        text = read_text(path, "decisions")
    except FileNotFoundError:
        return {}
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"cannot read decisions {path}: {type(exc).__name__}: "
                         f"{str(exc)[:200]}") from None
    if not isinstance(data, dict) or not isinstance(data.get("decisions"), list):
        raise ValueError(f"{path}: expected {{\"decisions\": [...]}}")
    out = {}
    for entry in data["decisions"]:
        if not isinstance(entry, dict):
            raise ValueError(f"{path}: each decision must be an object")
        out[_entry_key(entry, path)] = {k: entry[k] for k in (
            "nranks", "nodes", "class", "min_bytes", "max_bytes", "dtype", "op", "algorithm",
            "how", "count", "times_us", "predicted_us", "calls") if k in entry}
    return out


def save_decision(path, nranks: int, nodes: Sequence[int], klass: int, dtype: str, op: str,
                  decision: Decision) -> None:
    """Add (or replace) one decision in the file at ``path`` (written whole, atomically)."""
    kept = load_decisions(path)
    lo, hi = class_bounds(klass)
    entry = {"nranks": int(nranks), "nodes": [int(n) for n in nodes], "class": int(klass),
             "min_bytes": lo, "max_bytes": hi, "dtype": str(dtype), "op": str(op),
             "algorithm": decision.algorithm, "how": decision.how, "count": decision.count,
             "times_us": {n: t * 1e6 for n, t in decision.times.items()},
             "predicted_us": {n: t * 1e6 for n, t in decision.predicted.items()},
             "calls": decision.calls}
    kept[decision_key(nranks, nodes, klass, dtype, op)] = entry
    ordered = [kept[k] for k in sorted(kept)]
    write_json({"version": _VERSION, "decisions": ordered}, path)
