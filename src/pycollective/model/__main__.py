"""``python -m pycollective.model``: the model's command line, kept with the measuring tools."""

import sys

from ..bench._model_cli import main

if __name__ == "__main__":
    sys.exit(main())
