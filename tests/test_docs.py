"""The docs: a short README, links that resolve, and generated or runnable parts that match the code.

    python tests/test_docs.py settings-table    # the table in docs/configuration.md

README.md is the front door (under 250 lines); everything else lives in
docs/.  These tests keep what the docs show tied to the code: the Quick start
command is the one CI runs, the settings table is generated from
``pycollective.runtime.env.SETTINGS``, every ``pycollective.model`` command parses,
and the example algorithm of docs/algorithms.md registers and runs.
"""

import importlib.util
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
MAX_README_LINES = 201  # README.md at most 200 lines: a front door
BENCH_QUICK_START = ("python3 -m venv .venv && . .venv/bin/activate && pip install . && "
                     "scripts/run_mpi.sh 8 -m pycollective.bench ring --M 1e8")
TABLE_BEGIN = "<!-- settings-table: generated, do not edit by hand -->"
TABLE_END = "<!-- /settings-table -->"
EXAMPLE_MARK = re.compile(r"<!-- example-algorithm: (\w+) -->\s*```python\n(.*?)```", re.S)


def settings_table():
    """The Markdown table of every environment setting, from ``pycollective.runtime.env.SETTINGS``."""
    from pycollective.runtime.env import SETTINGS
    rows = ["| variable | default | what it does |", "|---|---|---|"]
    rows += [f"| `{s.name}` | `{s.default!r}` | {s.doc} |" for s in SETTINGS.values()]
    return "\n".join(rows)


def _pages():
    return [README] + sorted(DOCS.rglob("*.md"))


def _split_fences(text):
    """(prose lines, code lines) of a Markdown text; the other kind blanked."""
    prose, code, fenced = [], [], False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            prose.append("")
            code.append("")
        elif fenced:
            prose.append("")
            code.append(line)
        else:
            prose.append(line)
            code.append("")
    return prose, code


def _slug(heading):
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(path):
    seen, anchors = {}, set()
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    for line in prose:
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _links(path):
    prose, _ = _split_fences(path.read_text(encoding="utf-8"))
    for number, line in enumerate(prose, 1):
        line = re.sub(r"`[^`]*`", "", line)
        for target in re.findall(r"\]\(([^)\s]+)\)", line):
            yield number, target


def test_readme_is_a_short_front_door():
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) < MAX_README_LINES, f"README.md has {len(lines)} lines; move detail to docs/"


@pytest.mark.parametrize("page", _pages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(page):
    broken = []
    for number, target in _links(page):
        if re.match(r"[a-z]+:", target):  # http:, https:, mailto:
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"line {number}: {target} (no such file)")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"line {number}: {target} (no heading #{anchor})")
    assert not broken, f"{page.relative_to(ROOT)}:\n" + "\n".join(broken)


def test_quick_start_is_what_ci_runs():
    text = README.read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)\n```", section, re.S)
    ci = [line for line in (ROOT / ".ci" / "run").read_text().splitlines()
          if line.startswith("python3 -m venv")]
    assert len(ci) == 1, ".ci/run should run exactly one Quick start command"
    assert blocks == [BENCH_QUICK_START, ci[0]]


def test_configuration_lists_every_setting():
    text = (DOCS / "configuration.md").read_text(encoding="utf-8")
    inside = text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip()
    assert inside == settings_table(), (
        "docs/configuration.md is out of date; regenerate its table with "
        "`python tests/test_docs.py settings-table`")


def _model_commands():
    for page in _pages():
        for line in page.read_text(encoding="utf-8").splitlines():
            for args in re.findall(r"-m pycollective\.model\b([^`#\n]*)", line):
                yield page, line, args


def test_model_commands_parse():
    from pycollective.bench._model_cli import build_parser
    found = 0
    for page, line, args in _model_commands():
        tokens = shlex.split(args)
        if not tokens:  # the module named in prose, not a command
            continue
        found += 1
        # "lecture|table|show" lists alternatives: each must parse.
        variants = [tokens]
        if tokens and "|" in tokens[0]:
            variants = [[choice] + tokens[1:] for choice in tokens[0].split("|")]
        for variant in variants:
            try:
                build_parser().parse_args(variant)
            except SystemExit:
                pytest.fail(f"{page.relative_to(ROOT)}: does not parse: {line.strip()}")
    assert found >= 5


def _example():
    text = (DOCS / "algorithms.md").read_text(encoding="utf-8")
    found = EXAMPLE_MARK.search(text)
    assert found, "docs/algorithms.md lost its example algorithm"
    return found.group(1), found.group(2)


def _load(path, module_name):
    spec = importlib.util.spec_from_file_location(module_name, path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))


_RUN_EXAMPLE = '''
import sys
import numpy as np
from mpi4py import MPI
import pycollective
from pycollective.bench._exact import compare, fill_exact
from pycollective.data.ops import MPI_OPS
sys.path.insert(0, sys.argv[1])
from test_docs import _load
_load(sys.argv[2], "pycollective.algorithms._docs_example")
name, world = sys.argv[3], MPI.COMM_WORLD
half = world.Split(int(world.rank < 2), world.rank)
for comm in (world, half):
    n = comm.size
    for count in (0, 1, n - 1, n, n + 1, 10007):
        for dtype in ("float32", "int32", "uint8"):
            for op in ("sum", "prod", "max", "min"):
                for inplace in (False, True):
                    src = np.empty(count, dtype)
                    fill_exact(src, comm.rank, n, op)
                    want = np.empty_like(src)
                    comm.Allreduce(src, want, op=MPI_OPS[op])
                    got = src.copy() if inplace else np.full_like(src, 7)
                    pycollective.allreduce(MPI.IN_PLACE if inplace else src, got, op,
                                           comm=comm, algorithm=name)
                    wrong, _ = compare(got, want)
                    assert wrong == 0, (world.rank, n, count, dtype, op, inplace, wrong)
if world.rank == 0:
    print("example algorithm ok")
'''


def test_example_algorithm_registers_once(tmp_path):
    import pycollective
    from pycollective.runtime import registry as _registry
    name, code = _example()
    path = tmp_path / f"{name}.py"
    path.write_text(code)
    assert name not in pycollective.algorithms()
    try:
        _load(path, "pycollective.algorithms._docs_example")
        assert pycollective.algorithms()[-1] == name
        with pytest.raises(ValueError, match="already registered"):
            _load(path, "pycollective.algorithms._docs_example")
    finally:
        _registry.unregister(name)
    assert name not in pycollective.algorithms()


def _launch(nranks, *args):
    env = dict(os.environ, PYTHON=sys.executable, PYCOLLECTIVE_TIMEOUT="300")
    proc = subprocess.run([str(ROOT / "scripts" / "run_mpi.sh"), str(nranks), *map(str, args)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=360)
    return proc.returncode, proc.stdout + proc.stderr


def test_readme_example_runs(tmp_path):
    section = README.read_text(encoding="utf-8").split("## Example", 1)[1].split("\n## ", 1)[0]
    code = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(code) == 1, "README's Example section should hold one python block"
    script = tmp_path / "example.py"
    script.write_text(code[0] + "\nassert (grad == (comm.size + 1) / 2).all() and (out == grad).all()\n")
    status, output = _launch(2, script)
    assert status == 0, output[-5000:]


def test_example_algorithm_matches_native(tmp_path):
    name, code = _example()
    module = tmp_path / f"{name}.py"
    module.write_text(code)
    script = tmp_path / "run_example.py"
    script.write_text(_RUN_EXAMPLE)
    status, output = _launch(3, script, Path(__file__).parent, module, name)
    assert status == 0 and "example algorithm ok" in output, output[-5000:]


def test_training_example_runs(tmp_path):
    """docs/training.md's script at 2 ranks: it fits the line and prints the weights it learnt."""
    text = (DOCS / "training.md").read_text(encoding="utf-8")
    code = re.findall(r"```python\n(.*?)```", text.split("## A whole script", 1)[1], re.S)[0]
    script = tmp_path / "train_linear.py"
    script.write_text(code + "\nassert np.abs(params['w'].ravel() - np.arange(8)).max() < 1e-3\n")
    status, output = _launch(2, script)
    assert status == 0 and "2 ranks: w = [" in output, output[-5000:]


if __name__ == "__main__":
    if sys.argv[1:] != ["settings-table"]:
        sys.exit("usage: python tests/test_docs.py settings-table")
    print(settings_table())
