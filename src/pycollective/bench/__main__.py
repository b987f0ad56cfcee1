"""``python -m pycollective.bench``: see :mod:`pycollective.bench`."""

from ._cli import _cli

_cli()
