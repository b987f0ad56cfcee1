"""The installed distribution carries the checkout's library, file for file.

The suite runs ``src/`` (``tests/conftest.py``); what users import is the copy
``pip install .`` put in site-packages.  Where that copy is a regular install
(not an editable one), every module and data file of ``src/pycollective`` must
be in it, byte for byte: a file the build left out, or an install older than
the checkout, fails here rather than only on a user's machine.
"""

import hashlib
from importlib import metadata
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"


def _sources():
    """{relative path: sha256} of the library's files in the checkout (no caches)."""
    found = {}
    for path in (SRC / "pycollective").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            found[path.relative_to(SRC).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


def _installed():
    """{relative path: located file} of the installed distribution's library files, or
    None where there is no regular install of it."""
    # every distribution of that name on the path: the build leaves its egg-info in src/,
    # which lists the checkout's files, not installed ones
    for dist in metadata.distributions(name="pycollective"):
        files = {f.as_posix(): f for f in dist.files or ()
                 if f.as_posix().startswith("pycollective/") and "__pycache__" not in f.parts}
        if files:  # an editable install lists no library files
            return files
    return None


def test_the_installed_copy_is_the_checkouts_library():
    installed = _installed()
    if installed is None:
        pytest.skip("pycollective is not installed from this checkout with pip install . "
                    "(an editable install or none): nothing to compare")
    sources = _sources()
    missing = sorted(set(sources) - set(installed))
    assert not missing, f"the installed distribution lacks {missing[:10]} (pip install . again?)"
    differ = sorted(name for name, digest in sources.items()
                    if hashlib.sha256(Path(installed[name].locate()).read_bytes()).hexdigest()
                    != digest)
    assert not differ, f"the installed copy differs from src/ in {differ[:10]} (pip install . again)"
