"""Benchmark and check pycollective's allreduce algorithms against native MPI.

    scripts/run_mpi.sh 8 -m pycollective.bench ring --M 1e8
    scripts/run_mpi.sh 4 -m pycollective.bench all --minbytes 4 --maxbytes 64M --stepfactor 4
    scripts/run_mpi.sh 2 -m pycollective.bench membw
    scripts/run_mpi.sh 2 -m pycollective.bench latency --inner 200 --agree both
    scripts/run_mpi.sh 4 -m pycollective.bench segments --M 1e7
    scripts/run_mpi.sh 2 -m pycollective.bench breakdown --M 3e7
    python -m pycollective.bench env

One tool with a command per study, in the manner of ``python -m mpi4py.bench``
(:data:`COMMANDS`; each is a function of the parsed arguments and a session
that returns its rows; only rank 0 prints):

==============  ===============================================================
``allreduce``   time and check algorithms against native ``MPI_Allreduce`` at
                one size or over a sweep, with the cost model's predictions and
                the auto score; the default: an argument that names no
                command is the allreduce command's
``membw``       memory bandwidth with every rank copying: the allreduce floor
``latency``     the pieces of one small "shm" call, then back-to-back calls
``segments``    ring_pipelined at several segment sizes in one run
``breakdown``   the phases of one large "shm" call
``compress``    compressed allreduce (fp16/bf16 on the wire) against float32:
                bytes, time and error against the stated bound
``env``         the machine, the MPI library, every ``PYCOLLECTIVE_*`` setting
==============  ===============================================================

The measuring tools of the project live here, and nothing in the library
imports them (only the command lines and the tests): ``_harness`` (warm-up,
timing, checks and cross-rank agreement of any collective), ``_cli`` (the
registry, parsing, output conventions, ``--json``), ``_args`` (shared
options), ``_allreduce`` and ``_report`` (the allreduce command, its tables
and plot), ``_speed`` (membw, latency, segments), ``_profile`` (the only
command that reaches into the library's internals), ``_schema`` and
``schema.json`` (the ``--json`` format); ``_calibration`` (measuring the
model's parameters, ``pycollective.model.calibrate``), ``_model_cli``
(``python -m pycollective.model``), ``_zero_ledger`` (ZeRO's measured ledger,
``python -m pycollective.zero --ledger``); and the helpers they share:
``_timing`` (timing loops), ``_exact`` (exact test data, shared with the
tests), ``_table`` (text tables), ``_units`` (counts and sizes as typed),
``_about`` (what a measurement ran on).  Conventions: see
:mod:`pycollective.bench._cli`.  Run ``--help`` on any command for the
meaning of every column.

May import: anything in ``pycollective``.
"""

# Importing a command's module registers it (_cli.COMMANDS).
from ._allreduce import ALLREDUCE, algorithm_case, parse_args, sweep_counts
from ._cli import COMMANDS, main
from ._compress import compress  # noqa: F401
from ._harness import failures
from ._profile import breakdown  # noqa: F401
from ._report import auto_score
from ._schema import SCHEMA_VERSION, load_schema, validate
from ._speed import latency, membw, segments  # noqa: F401

__all__ = ["main", "COMMANDS", "ALLREDUCE", "algorithm_case", "parse_args", "sweep_counts",
           "auto_score", "failures", "SCHEMA_VERSION", "load_schema", "validate"]
