"""``python -m pycollective.bench``: see :func:`pycollective.bench.main`."""

from . import _cli

_cli()
