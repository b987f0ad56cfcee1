"""The package's shape: imports flow one way, every module imports on its own.

The layers (docs/architecture.md): small utilities -> context ->
shared-memory primitives -> algorithms -> agreement / fast path / auto
choice (and the pure cost model) -> the public collectives -> what is
built on them (drop-in, bucketing, bench, calibration, CLIs).  A module may
import from its own layer or below, never above; the core imports no
algorithm module except where an algorithm's phases *are* a public
collective (ring's reduce-scatter and allgather).
"""

import ast
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = "pycollective"

LAYERS = [
    # 0: no MPI state of their own
    {"_errors", "data", "data.*", "node.atomics", "node.views", "runtime.env", "runtime.settings",
     "runtime.registry", "runtime.root", "compression"},
    {"runtime", "runtime.watch", "runtime.context"},
    {"node", "node.group", "node.cma", "node.segment", "node.barrier", "node.arrays"},
    {"algorithms", "algorithms.*"},
    {"collectives.agree", "collectives.plans", "collectives.auto", "collectives.probe",
     "collectives.choose", "model",
     "model.formulas", "model.lecture", "model.params", "model.choice", "model.fit",
     "model.ledger", "model.topology", "model.tuning"},
    {"collectives.call"},
    {"collectives", "collectives.api", "collectives.options", "collectives.allocate"},
    # what the drop-in is built from: its argument plans and its nonblocking engine
    {"comm.arguments", "comm.nonblocking"},
    {"comm", "comm.dropin", "training", "training.*", ""},
    # training built on the library; nothing below imports it
    {"zero", "zero._checkpoint", "zero._comms", "zero._mlp", "zero._optimizer", "zero._precision",
     "torch"},
    # measuring tools and the command lines: the library never imports them
    {"bench", "bench.*", "model.__main__", "zero.__main__"},
]

# Where the core may reach into an algorithm module, and why.
ALGORITHM_IMPORTS_ALLOWED = {
    ("collectives.api", "algorithms"): "importing the package registers every algorithm",
    ("collectives.options", "algorithms"): "algorithms() lists what importing the package registers",
}


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


def _layer(name):
    for i, layer in enumerate(LAYERS):
        for pattern in layer:
            if name == pattern or (pattern.endswith(".*") and name.startswith(pattern[:-1])):
                return i
    raise AssertionError(f"module {ROOT}.{name} is in no layer: add it to LAYERS "
                         "(and to docs/architecture.md)")


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


def test_imports_flow_down_the_layers():
    wrong = []
    for name, targets in import_graph().items():
        for target in targets:
            if _layer(target) > _layer(name):
                wrong.append(f"{name} (layer {_layer(name)}) imports {target} "
                             f"(layer {_layer(target)})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_core_imports_algorithms_only_where_a_collective_is_an_algorithm():
    core = {n for n in MODULES if _layer(n) in (0, 1, 2, 4, 5, 6, 7)}
    graph = import_graph()  # once: it parses every module
    wrong = [f"{name} imports {target}" for name in sorted(core)
             for target in sorted(graph[name])
             if _layer(target) == 3 and (name, target) not in ALGORITHM_IMPORTS_ALLOWED]
    assert not wrong, "\n".join(wrong)


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
