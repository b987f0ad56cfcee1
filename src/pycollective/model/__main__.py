"""``python -m pycollective.model``: see :func:`pycollective.model.main`."""

import sys

from . import main

sys.exit(main())
