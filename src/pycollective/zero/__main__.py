"""``python -m pycollective.zero``: the ZeRO ledger, measured, and the lecture's example 4.5.

    scripts/run_mpi.sh 8 -m pycollective.zero --ledger              # N = 1, 2, 4, 8
    scripts/run_mpi.sh 8 -m pycollective.zero --ledger --M 1e6 --json ledger.json
    scripts/run_mpi.sh 2 -m pycollective.zero --overlap --precision fp32   # stage 2's overlap
    python -m pycollective.zero --example-4-5

Columns of the ledger (one row per N and stage; bytes per rank):
  N, stage       communicator size; 0 = baseline data parallelism
  held MB        params + grads + optimizer state, from the arrays' nbytes
  lecture MB     20M, 4M + 16M/N, 2M + 18M/N, 20M/N (2-byte working copies)
  held/lecture   their ratio
  +RSS MB        resident memory gained (after the steps vs before the
                 optimizer), peak +RSS: the largest during the measured step
                 (activations, buckets, gathered layers and temporaries too)
  sent           elements this rank sent in one step (largest over ranks)
  lecture sent   2M(N-1)/N (stages 0-2), 3M(N-1)/N (stage 3)
  step ms        one training step (slowest rank; lower quartile of --steps)
  in step ms     time the step spent inside its collective calls: with
                 waiting for peers still computing, without what overlapped
  comm ms        the step's calls replayed one at a time, each after a
                 barrier: the collectives alone (slowest rank, lower quartile)
  model ms       alpha-beta-gamma prediction of those calls, with alpha,
                 beta, gamma measured on the group just before (or, with
                 --no-calibrate, the saved calibration or built-in defaults)
  comm/model     their ratio
  1-elem ms      the same calls with one element per rank (replayed alike):
                 the cost of a call besides its bytes; 1-elem model: the
                 model's alpha terms of those calls

The group of size N is the world's first N ranks; the others sleep meanwhile.
"""

import argparse
import json
import os
import sys

import numpy as np
from mpi4py import MPI

from ..bench._about import environment
from ..bench._table import fmt_num, format_table
from ..bench._timing import lower_quartile
from ..bench._units import count_arg
from ..model.ledger import LECTURE_MEMORY, LECTURE_TRAFFIC, worked_example_4_5
from ..bench._zero_ledger import measure, overlap
from ._precision import PRECISIONS


def _mb(x):
    return fmt_num(None if x is None else x / 1e6)


def _ratio(a, b):
    return "-" if not b else f"{a / b:.3f}"


COLUMNS = [
    ("N", lambda r: r["nranks"]),
    ("stage", lambda r: r["stage"]),
    ("lecture", lambda r: LECTURE_MEMORY[r["stage"]]),
    ("params MB", lambda r: _mb(r["params"])),
    ("grads MB", lambda r: _mb(r["grads"])),
    ("optim MB", lambda r: _mb(r["optimizer"])),
    ("held MB", lambda r: _mb(r["total"])),
    ("lecture MB", lambda r: _mb(r["formula"])),
    ("held/lecture", lambda r: _ratio(r["total"], r["formula"])),
    ("+RSS MB", lambda r: _mb(r["rss"])),
    ("peak +RSS MB", lambda r: _mb(r["peak_rss"])),
    ("sent", lambda r: r["sent"]),
    ("lecture sent", lambda r: f"{LECTURE_TRAFFIC[r['stage']]}(N-1)/N={r['sent_formula']:.0f}"),
    ("sent/lecture", lambda r: _ratio(r["sent"], r["sent_formula"])),
    ("step ms", lambda r: fmt_num(r["step_s"] * 1e3)),
    ("in step ms", lambda r: fmt_num(r["in_step_s"] * 1e3)),
    ("comm ms", lambda r: fmt_num(r["comm_s"] * 1e3)),
    ("model ms", lambda r: fmt_num(r["predicted_s"] * 1e3)),
    ("comm/model", lambda r: _ratio(r["comm_s"], r["predicted_s"])),
    ("1-elem ms", lambda r: fmt_num(r["fixed_s"] * 1e3)),
    ("1-elem model ms", lambda r: fmt_num(r["fixed_predicted_s"] * 1e3)),
]


def example_lines():
    """The lecture's worked example 4.5, recomputed."""
    ex = worked_example_4_5()
    lines = ["# lecture example 4.5: M = 175e9 parameters, N = 64 GPUs, 50 GB/s, 125 TFLOP/s, "
             "T = 3.2e6 tokens"]
    for stage, gb in ex.memory_gb.items():
        lines.append(f"#   memory per GPU, stage {stage} ({LECTURE_MEMORY[stage]}): {gb:.1f} GB")
    lines += [f"#   traffic per GPU per iteration: {ex.traffic_gb[0]:.0f} GB (2M, stages 0-2), "
              f"{ex.traffic_gb[3]:.0f} GB (3M, stage 3)",
              f"#   communication {ex.comm_s:.1f} s, compute {ex.compute_s:.0f} s: "
              f"{100 * ex.comm_share:.1f} % of compute",
              f"#   at T = 8192 tokens: compute {ex.small_batch_compute_s:.2f} s, communication "
              f"{100 * ex.small_batch_comm_share:.0f} % of the iteration",
              f"#   crossover batch: {ex.crossover_tokens:.3g} tokens"]
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m pycollective.zero",
                                description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--ledger", action="store_true",
                   help="measure the memory and traffic ledger (collective: run under mpiexec)")
    p.add_argument("--overlap", action="store_true",
                   help="time stage 2 steps with the gradient reduce-scatters waited for layer "
                        "by layer (buckets_in_flight=1) and overlapped with the backward (2), "
                        "interleaved (collective)")
    p.add_argument("--batch", type=int, default=8, help="samples per rank")
    p.add_argument("--reps", type=int, default=15, help="--overlap: steps of each kind")
    p.add_argument("--example-4-5", action="store_true",
                   help="print the lecture's worked example 4.5 from the model's formulas")
    p.add_argument("--M", type=count_arg, default=3_000_000,
                   help="parameters of the measured MLP, about (3 square layers)")
    p.add_argument("--sizes", default="1,2,4,8", help="communicator sizes N to measure")
    p.add_argument("--precision", choices=sorted(PRECISIONS), default="fp16")
    p.add_argument("--no-calibrate", action="store_true",
                   help="predict with the saved calibration or the built-in defaults instead of "
                        "measuring alpha, beta, gamma on each group first")
    p.add_argument("--steps", type=int, default=5,
                   help="measured training steps (their lower quartile is shown)")
    p.add_argument("--json", default=None, metavar="FILE", help="also write the rows as JSON")
    args = p.parse_args(argv)
    if not (args.ledger or args.example_4_5 or args.overlap):
        p.error("nothing to do: give --ledger, --overlap and/or --example-4-5")
    world = MPI.COMM_WORLD
    out = sys.stdout if world.Get_rank() == 0 else None
    rows = []
    if args.example_4_5 and out:
        print("\n".join(example_lines()), file=out)
    if args.ledger:
        sizes = [int(s) for s in args.sizes.split(",") if s]
        about = environment(world)
        load_before = os.getloadavg()[0]
        rows = measure(world, args.M, sizes=sizes, precision=args.precision,
                       calibrate=not args.no_calibrate, steps=args.steps, batch=args.batch)
        if out:
            print(f"# python -m pycollective.zero --ledger --M {args.M} --precision "
                  f"{args.precision} on {world.Get_size()} ranks; MLP of {rows[0]['count']} "
                  "parameters; bytes per rank (rank 0), MB = 1e6 B", file=out)
            print(f"# {about['time_utc']} on {about['hostname']} ({about['cpu_count']} CPUs), "
                  f"{about['mpi_library'].splitlines()[0]}; load average (1 min) "
                  f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after", file=out)
            print(format_table(COLUMNS, rows, prefix="# "), file=out)
            for source in dict.fromkeys(r["params_source"] for r in rows if r["nranks"] > 1):
                ns = sorted({r["nranks"] for r in rows if r["params_source"] == source})
                print(f"# model parameters (N = {', '.join(map(str, ns))}): {source}", file=out)
            wire = PRECISIONS[rows[0]["precision"]].name
            for r in rows:
                if r["nranks"] > 1 and r["stage"] == rows[0]["stage"]:
                    m = r["rates"]
                    print(f"#   N = {r['nranks']}: alpha {m['alpha'] * 1e6:.3g} us, beta "
                          f"{m['beta'] * 1e9:.3g} ns/B, gamma({wire}) {m['gamma'] * 1e9:.3g} ns/B "
                          f"(at a chunk of {m['chunk']} elements)", file=out)
            if args.json:
                with open(args.json, "w") as f:
                    json.dump(rows, f, indent=1)
    if args.overlap:
        load_before = os.getloadavg()[0]
        got = overlap(world, args.M, precision=args.precision, batch=args.batch, reps=args.reps)
        if out:
            base = got[1]
            print(f"# stage 2 step, MLP of about {args.M:.3g} parameters ({args.precision}), "
                  f"batch {args.batch} per rank, {world.Get_size()} ranks, {len(base)} steps "
                  f"each, interleaved; load average {load_before:.2f} before, "
                  f"{os.getloadavg()[0]:.2f} after", file=out)
            print("# buckets_in_flight  median ms  lower quartile ms  median / in flight 1",
                  file=out)
            for k, t in got.items():
                print(f"  {k:17d}  {np.median(t) * 1e3:9.2f}  {lower_quartile(t) * 1e3:17.2f}  "
                      f"{np.median(t) / np.median(base):20.3f}", file=out)
    return rows


if __name__ == "__main__":
    main()
