"""The package's shape: one rule per package, imports flow one way, every module imports on its own.

Each package of ``src/pycollective`` (and each of the few top-level modules)
is one concern and has one rule: the packages it may import (``RULES``, as
in docs/architecture.md and in each package's ``__init__`` docstring).  The
rules form a graph without cycles, from the data (buffers, ops, kernels) up
to training; ``bench`` (the measuring tools) may import anything and nothing
in the library imports it, only the command lines (``__main__``).  A module
may import its own package's modules (without cycles) and the packages its
rule names, function-local imports included.
"""

import ast
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "pycollective"

# package (first part of a module's dotted name; "" is the facade) -> the packages it may
# import.  "=algorithms": the algorithms package itself (importing it registers them all),
# none of its modules.
RULES = {
    "_errors": set(),
    "timeline": {"_errors"},
    "data": {"_errors"},
    "compression": {"data"},
    "runtime": {"data", "timeline", "_errors"},
    "node": {"runtime", "data", "timeline", "_errors"},
    "model": {"runtime", "data"},
    "algorithms": {"node", "runtime", "data", "timeline", "_errors"},
    "device": {"runtime", "data", "_errors"},
    "collectives": {"=algorithms", "device", "model", "node", "runtime", "data", "compression",
                    "timeline", "_errors"},
    "comm": {"collectives", "device", "runtime", "data", "compression", "timeline",
             "_errors"},
    "training": {"comm", "collectives", "data", "compression", "_errors"},
    "zero": {"comm", "collectives", "model", "data", "compression", "_errors"},
    "torch": {"comm", "runtime", "compression", "timeline"},
    "": {"collectives", "comm", "training", "data", "runtime", "timeline", "_errors"},
    "bench": {"*"},
}
# A command line (``python -m pycollective.X``) may also use the measuring tools.
MAIN_MAY_IMPORT = {"bench"}
MAX_TOP_LEVEL_MODULES = 12
MAX_LINES = 600


def _modules():
    """{dotted name relative to the package ('' for the package): path}."""
    found = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        rel = path.relative_to(SRC / ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _is_package(name):
    return MODULES[name].name == "__init__.py"


def _resolve(module, node):
    """Targets (relative dotted names) of one import statement inside ``module``."""
    targets = []
    if isinstance(node, ast.Import):
        for alias in node.names:
            if alias.name == ROOT or alias.name.startswith(ROOT + "."):
                targets.append(alias.name[len(ROOT) + 1:])
        return targets
    if node.level:
        base = module.split(".") if module else []
        if not _is_package(module):
            base = base[:-1]
        base = base[:len(base) - (node.level - 1)] if node.level > 1 else base
        prefix = ".".join(base + ([node.module] if node.module else []))
    elif node.module == ROOT or (node.module or "").startswith(ROOT + "."):
        prefix = node.module[len(ROOT) + 1:]
    else:
        return targets
    subs = [f"{prefix}.{alias.name}" if prefix else alias.name for alias in node.names]
    modules = [sub for sub in subs if sub in MODULES]  # ``from . import ring`` imports a module
    # The package itself is a target unless only its submodules are imported
    # from inside it (``from . import _shm_steps`` in algorithms/shm.py needs
    # nothing of algorithms/__init__.py beyond what is already running).
    if len(modules) < len(subs) or not module.startswith(prefix + "."):
        targets.append(prefix)
    return targets + modules


def _ancestors(name):
    parts = name.split(".")
    return [".".join(parts[:i]) for i in range(1, len(parts))]


def import_graph():
    """Edges ``module -> module`` from every import statement, function-local ones included.

    Importing ``a.b`` first runs package ``a``'s ``__init__``, so an import
    from outside a subpackage also depends on that package; the root package
    (the public facade, imported first by everything) is left out.
    """
    graph = {name: set() for name in MODULES}
    for name, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for target in _resolve(name, node):
                if target not in MODULES or target == name or target == "":
                    continue
                graph[name].add(target)
                for parent in _ancestors(target):
                    if parent not in _ancestors(name) and parent != name:
                        graph[name].add(parent)
    return graph


def package_of(name):
    return name.split(".")[0]


def violations(graph):
    """The imports that break a package's rule, as text (empty: none)."""
    wrong = []
    for name, targets in graph.items():
        own = package_of(name)
        if own not in RULES:
            wrong.append(f"pycollective.{own} has no rule: add it to RULES "
                         "(and to docs/architecture.md)")
            continue
        allowed = RULES[own] | (MAIN_MAY_IMPORT if name.endswith("__main__") else set())
        for target in sorted(targets):
            other = package_of(target)
            if other == own or "*" in allowed or other in allowed or f"={target}" in allowed:
                continue
            wrong.append(f"{name} imports {target}: {own or 'the facade'} may import "
                         f"{', '.join(sorted(allowed)) or 'nothing of pycollective'}")
    return wrong


def find_cycle(graph):
    """One import cycle as a list of modules, or None."""
    state, stack = {}, []

    def visit(node):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_no_import_cycles():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(f"{ROOT}.{m}".rstrip(".") for m in cycle)


def test_the_cycle_finder_finds_cycles():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_every_package_keeps_its_rule():
    wrong = violations(import_graph())
    assert not wrong, "\n".join(sorted(set(wrong)))


def test_the_rules_form_no_cycle():
    graph = {pkg: {t.lstrip("=") for t in allowed if t != "*"} for pkg, allowed in RULES.items()}
    assert find_cycle(graph) is None


def test_a_broken_rule_is_found():
    # the checker itself: an import up the graph, into an algorithm module, and into bench
    found = violations({"data.kernels": {"collectives.api"},
                        "collectives.api": {"algorithms", "algorithms.ring"},
                        "model.params": {"bench._timing"}, "model.__main__": {"bench._model_cli"},
                        "newthing": set()})
    assert any("data.kernels imports collectives.api" in w for w in found)
    assert any("collectives.api imports algorithms.ring" in w for w in found)
    assert not any("imports algorithms:" in w for w in found)
    assert any("model.params imports bench._timing" in w for w in found)
    assert not any("model.__main__" in w for w in found)
    assert any("newthing has no rule" in w for w in found)


def test_each_package_says_what_it_holds_and_may_import():
    missing = [name for name in MODULES if name and "." not in name and _is_package(name)
               and "May import" not in (ast.get_docstring(ast.parse(MODULES[name].read_text())) or "")]
    assert not missing, f"packages whose __init__ docstring does not say what they may import: {missing}"


def test_few_top_level_modules_and_no_long_file():
    top = [p.name for p in (SRC / ROOT).glob("*.py")]
    assert len(top) <= MAX_TOP_LEVEL_MODULES, sorted(top)
    long = [f"{p.relative_to(SRC)}: {n}" for p in (SRC / ROOT).rglob("*.py")
            if (n := len(p.read_text().splitlines())) > MAX_LINES]
    assert not long, long


# Each module is imported first in a process of its own, forked from one
# that has loaded the heavy third-party packages but nothing of pycollective
# (and not mpi4py.MPI: no MPI state crosses a fork).  The order in which
# pycollective's own modules load, which is what a cycle depends on, is the
# fresh interpreter's; each process costs 0.2 s instead of the 1.4 s of
# starting Python and loading numba and numpy again (86 modules, 2 cores).
_IMPORT_FIRST = """
import importlib, json, multiprocessing, sys, traceback
import llvmlite.binding, ml_dtypes, numba, numpy
assert not any(m.split(".")[0] == "pycollective" for m in sys.modules)

def first(name):
    try:
        importlib.import_module(name)
    except BaseException:
        return "import " + name + " failed:\\n" + traceback.format_exc()[-2000:]
    finally:
        # A pool's worker leaves through os._exit, past mpi4py's atexit: the
        # MPI library it started must end here, or MPICH's segments stay in /dev/shm.
        MPI = sys.modules.get("mpi4py.MPI")
        if MPI is not None and MPI.Is_initialized() and not MPI.Is_finalized():
            MPI.Finalize()

with multiprocessing.get_context("fork").Pool(2, maxtasksperchild=1) as pool:
    print(json.dumps(pool.map(first, sys.argv[1:], chunksize=1)))
"""


def test_every_module_imports_first_in_a_fresh_interpreter():
    # A cycle that only bites in some import order shows up here.
    names = [f"{ROOT}.{n}" if n else ROOT for n in MODULES if not n.endswith("__main__")]
    proc = subprocess.run([sys.executable, "-c", _IMPORT_FIRST, *names], capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(results) == len(names)
    failures = [f for f in results if f]
    assert not failures, "\n".join(failures)


def test_the_command_lines_start():
    def run(args):
        return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                              timeout=120)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(run, [["pycollective.model", "--help"],
                                      ["pycollective.bench", "--help"],
                                      ["pycollective.zero", "--help"]]))
    for proc in results:
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert "usage:" in proc.stdout


def test_no_submodule_hides_a_lazy_name():
    """Importing ``pkg.x`` sets ``pkg.x`` to the module: a lazily exported name ``x``
    (PEP 562 ``__getattr__``) of the same package would then be the module, not the
    function (``model.calibrate`` was, once the ledger had imported its module)."""
    import pkgutil

    from pycollective import model
    submodules = {m.name for m in pkgutil.iter_modules(model.__path__)}
    assert not set(model._LAZY) & submodules
