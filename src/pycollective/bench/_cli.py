"""The benchmark's command line: a registry of commands and the conventions they share.

In the manner of ``python -m mpi4py.bench``: every command is a function that
runs collectively and returns its rows; only rank 0 prints.  What every
command does the same way lives here, once:

* parsing: each command has its own options plus the output options
  (``--json``, ``--quiet``, ``--progress``/``--no-progress``); every rank
  parses the same argv, so a bad argument exits with status 2 on every rank
  before any message is sent.  Facts only rank 0 can judge (the files it
  writes or reads) are judged by rank 0 and broadcast, so the verdict, and
  the exit, are the same everywhere -- before the run, not after it;
* output: lines that are not data start with ``#`` (nccl-tests), tables
  included (their header line is a comment, data lines are indented); a
  header names the command, the ranks, the machine and the MPI library;
* ``--json``: the report with ``schema_version`` (see ``schema.json``);
* exit status: 0 when every check passed, 1 otherwise, 2 for bad arguments;
* a closed standard output (``| head``) ends the job quietly: rank 0 takes
  the default action of SIGPIPE instead of raising ``BrokenPipeError``, so
  it ends without a traceback and the launcher ends the job.

The progress bar goes to rank 0's stderr.  It shows when ``--progress`` is
given, never with ``--no-progress``, and otherwise when rank 0's stderr is a
terminal -- true for direct runs, false under mpiexec, which gives every
rank a pipe; scripts that launch through mpiexec pass ``--progress`` when
their own stderr is a terminal (``benchmarks/run_sweep.sh`` does).
"""

import argparse
import json
import math
import os
import shlex
import signal
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, Optional

import numpy as np
from mpi4py import MPI

from ..runtime import env as _env
from ._about import environment
from ._table import format_rows
from ._harness import failures
from ._schema import SCHEMA_VERSION

__all__ = ["Command", "COMMANDS", "command", "main", "parse", "build_parser", "Session",
           "Progress", "output_problem", "DEFAULT"]

PROG = "python -m pycollective.bench"
DEFAULT = "allreduce"  # the command run when the first argument names no command


class Parser(argparse.ArgumentParser):
    """An ArgumentParser that prints only on rank 0 but exits on every rank.

    Every rank parses the same argv, so every rank reaches the same verdict
    without any message; only the printing is limited to one rank.
    """

    def _print_message(self, message, file=None):
        if MPI.COMM_WORLD.Get_rank() == 0:
            super()._print_message(message, file)


@dataclass(frozen=True)
class Command:
    """One subcommand.

    Attributes:
        name: what follows ``python -m pycollective.bench``.
        summary: one line for the list of commands.
        run: ``run(args, session) -> rows`` (collective; the same rows on
            every rank).
        options: ``options(parser)`` adds the command's own arguments.
        check: ``check(args, parser, nranks)`` validates the parsed
            arguments with facts that are the same on every rank (calls
            ``parser.error``).
        files: ``files(args) -> [(option, problem)]``: ``problem()`` returns
            None or what is wrong with a file rank 0 reads or writes.
        epilog: the end of ``--help``.
    """

    name: str
    summary: str
    run: Callable
    options: Callable
    check: Optional[Callable] = None
    files: Optional[Callable] = None
    epilog: str = ""


COMMANDS: Dict[str, Command] = {}


def command(name, summary, *, options, check=None, files=None, epilog=""):
    """Register the decorated ``run(args, session) -> rows`` as the command ``name``."""
    def register(run):
        if name in COMMANDS:
            raise ValueError(f"bench command {name!r} is already registered")
        COMMANDS[name] = Command(name, summary, run, options, check, files, epilog)
        return run
    return register


# --- files judged by rank 0 ---------------------------------------------------

def output_problem(path) -> Optional[str]:
    """None if ``path`` can be written, else why not (tried by opening it for appending).

    A file that did not exist is removed again, so a refused run leaves
    nothing behind and an accepted one finds the directory as it was.
    """
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return f"{path} is a directory"
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        return f"directory {parent} does not exist"
    existed = os.path.exists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as exc:
        return f"cannot write {path}: {exc.strerror or exc}"
    if not existed:
        os.unlink(path)
    return None


def input_problem(path) -> Optional[str]:
    """None if ``path`` is a readable file, else why not."""
    if not os.path.isfile(path):
        return f"{path}: no such file"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable"
    return None


def _check_files(parser, args, cmd, comm):
    checks = []
    if getattr(args, "json", None):
        checks.append(("--json", lambda: output_problem(args.json)))
    if cmd.files is not None:
        checks += cmd.files(args)
    if not checks:
        return
    problem = None
    if comm is None or comm.Get_rank() == 0:
        for option, judge in checks:
            why = judge()
            if why:
                problem = f"{option}: {why}"
                break
    if comm is not None and comm.Get_size() > 1:
        problem = comm.bcast(problem, root=0)
    if problem:
        parser.error(problem)


# --- parsing ----------------------------------------------------------------

def _common_options(p):
    out = p.add_argument_group("output")
    out.add_argument("--json", default=None, metavar="FILE",
                     help="write the report and every measurement as JSON (schema_version "
                          f"{SCHEMA_VERSION}, pycollective/bench/schema.json)")
    out.add_argument("--quiet", "-q", action="store_true", help="print nothing on stdout")
    bar = out.add_mutually_exclusive_group()
    bar.add_argument("--progress", dest="progress", action="store_const", const=True,
                     default=None, help="show a progress bar on rank 0's stderr (default: "
                                        "only when that is a terminal; under mpiexec it is not)")
    bar.add_argument("--no-progress", dest="progress", action="store_const", const=False,
                     help="never show the progress bar")


def _commands_epilog(current):
    others = [COMMANDS[n] for n in sorted(COMMANDS, key=lambda n: (n != DEFAULT, n))
              if n != current]
    lines = ["", "other commands (python -m pycollective.bench COMMAND --help):"]
    lines += [f"  {c.name:<10s}  {c.summary}" for c in others]
    return "\n".join(lines)


def build_parser(name):
    """The argument parser of command ``name``: its options, the output options."""
    cmd = COMMANDS[name]
    prog = PROG if name == DEFAULT else f"{PROG} {name}"
    p = Parser(prog=prog, description=cmd.summary,
               epilog=cmd.epilog + _commands_epilog(name),
               formatter_class=argparse.RawDescriptionHelpFormatter)
    cmd.options(p)
    _common_options(p)
    return p


def parse(name, argv, nranks, comm=None):
    """Parse and validate ``argv`` for command ``name``; the same verdict on every rank.

    Args:
        name: a registered command.
        argv: its arguments (without the command name).
        nranks: the communicator size (some checks depend on it).
        comm: if given, rank 0 judges the files and broadcasts the verdict
            (collective); else this process judges them.

    Raises:
        SystemExit: status 2 for bad arguments, 0 for ``--help``.
    """
    parser = build_parser(name)
    args = parser.parse_args(argv)
    if COMMANDS[name].check is not None:
        COMMANDS[name].check(args, parser, nranks)
    _check_files(parser, args, COMMANDS[name], comm)
    return args


# --- running ----------------------------------------------------------------

class Progress:
    """A one-line progress bar on rank 0's stderr.

    Args:
        total: steps in the run (no bar for a single step).
        enabled: False on every rank but 0, and with ``--no-progress``.
        force: show it even when stderr is not a terminal (``--progress``).
    """

    def __init__(self, total, enabled, force=False):
        self.total, self.done = total, 0
        self.enabled = enabled and total > 1 and (force or sys.stderr.isatty())

    def step(self, label):
        self.done += 1
        if self.enabled:
            width = 30
            filled = int(width * self.done / self.total)
            sys.stderr.write(f"\r[{'#' * filled}{'.' * (width - filled)}] "
                             f"{self.done}/{self.total} {label:<24s}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


@dataclass
class Session:
    """What a command's ``run`` gets besides its arguments."""

    comm: object
    args: argparse.Namespace
    out: object
    verbose: bool                                  # rank 0 and not --quiet
    report: dict = field(default_factory=dict)    # extra keys of the report / JSON
    skipped: Dict[str, str] = field(default_factory=dict)

    @property
    def rank(self):
        return self.comm.Get_rank()

    @property
    def nranks(self):
        return self.comm.Get_size()

    def print(self, text=""):
        """Print on rank 0 (unless --quiet)."""
        if self.verbose:
            print(text, file=self.out, flush=True)

    def progress(self, total):
        return Progress(total, enabled=self.rank == 0 and self.args.progress is not False,
                        force=self.args.progress is True)

    def skip(self, name, reason):
        """Record (and print) that ``name`` was left out, and why."""
        self.skipped[name] = reason
        self.print(f"# skipped {name}: {reason}")


def header(argv, env):
    """The comment lines every command prints first: the command line, where it ran."""
    v = env["versions"]
    return "\n".join([
        f"# {PROG} {shlex.join(argv)}".rstrip(),
        f"# {env['nranks']} ranks on {env['hostname']} ({env['cpu_count']} CPUs); "
        f"MPI library: {env['mpi_library']} (MPI {env['mpi_standard']}); mpi4py {v['mpi4py']}, "
        f"numpy {v['numpy']}, numba {v['numba']}, Python {v['python']}, "
        f"pycollective {v['pycollective']}; {env['time_utc']}",
    ])


def _jsonable(obj):
    """Plain JSON: numpy scalars as numbers, NaN and infinities as null."""
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        obj = obj.item()
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, np.dtype):
        return obj.name
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return str(obj)


def _split(argv):
    if argv and argv[0] in COMMANDS:
        return argv[0], list(argv[1:])
    return DEFAULT, list(argv)


def main(argv=None, comm=None, out=None):
    """Run one command; collective over ``comm``.

    ``argv[0]`` names the command (see :data:`COMMANDS`); anything else runs
    the default command, ``allreduce``, with the whole ``argv`` (so
    ``python -m pycollective.bench ring --M 1e8`` keeps working).

    Args:
        argv: command-line arguments (default ``sys.argv[1:]``).
        comm: communicator (default ``MPI.COMM_WORLD``).
        out: text stream for rank 0's output (default ``sys.stdout``).

    Returns:
        ``(rows, report)``, the same on every rank: the command's rows and
        the report (``schema_version``, ``command``, ``environment``,
        ``options``, ``skipped`` and what the command adds); ``--json``
        writes the report with the rows as ``measurements``.

    Raises:
        SystemExit: for bad arguments (status 2) or ``--help`` (0), on every rank.
    """
    comm = MPI.COMM_WORLD if comm is None else comm
    out = sys.stdout if out is None else out
    argv = sys.argv[1:] if argv is None else list(argv)
    name, rest = _split(argv)
    args = parse(name, rest, comm.Get_size(), comm)
    env = environment(comm)
    session = Session(comm, args, out, verbose=comm.Get_rank() == 0 and not args.quiet)
    session.print(header(argv, env))
    rows = COMMANDS[name].run(args, session)
    report = dict(schema_version=SCHEMA_VERSION, command=name, environment=env,
                  options=dict(vars(args)), skipped=dict(session.skipped), **session.report)
    if comm.Get_rank() == 0 and args.json:
        with open(args.json, "w") as f:
            json.dump(_jsonable(dict(report, measurements=rows)), f, allow_nan=False)
    return rows, report


def _cli():
    alone = MPI.COMM_WORLD.Get_size() == 1
    if MPI.COMM_WORLD.Get_rank() == 0 and hasattr(signal, "SIGPIPE") and not alone:
        # A reader that goes away (`| head`) ends this process quietly, as it
        # would any Unix filter, instead of a BrokenPipeError traceback; the
        # launcher then ends the job (a rank stopping on its own would leave
        # the others waiting).
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        rows, _ = main()
    except BrokenPipeError:
        if not alone or not hasattr(signal, "SIGPIPE"):
            raise
        # Started without a launcher there is nobody to end the job, and an
        # MPI library that initialised itself (a singleton) leaves its
        # segment in /dev/shm unless it is finalized: finalize, then die of
        # SIGPIPE as a filter would.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        MPI.Finalize()
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGPIPE)
        raise
    # Every rank holds the same agreed rows, so every rank exits the same way.
    sys.exit(1 if failures(rows) else 0)


# --- env: what a run would see ------------------------------------------------

def _env_options(p):
    pass


@command("env", "the machine, the MPI library and every PYCOLLECTIVE_* setting",
         options=_env_options)
def env_command(args, session):
    """One row per environment setting: name, value in effect, default, what it does."""
    rows = []
    for setting in _env.SETTINGS.values():
        try:
            value = setting.get()
        except ValueError as exc:
            value = f"invalid: {exc}"
        rows.append(dict(name=setting.name, value=value, default=setting.default,
                         set=setting.name in os.environ, doc=setting.doc))
    session.print(format_rows(["setting", "value", "default", "set"],
                              [(r["name"], _shown(r["value"]), _shown(r["default"]),
                                "yes" if r["set"] else "no") for r in rows], prefix="# "))
    for r in rows:
        session.print(f"# {r['name']}: {r['doc']}")
    return rows


def _shown(value):
    return "-" if value is None or value == "" else str(value)
