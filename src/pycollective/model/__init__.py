"""The α-β-γ cost model: predicted allreduce times, calibration, and what ``auto`` chooses.

A message of n bytes costs ``α + n·β`` and reducing n bytes costs ``n·γ``;
each registered algorithm declares its cost in those terms, next to its
code.  The package is split by concern:

==================  ===========================================================
``formulas``        evaluate an algorithm's registered cost (:func:`predict`)
``lecture``         the lecture's textbook formulas and worked examples
``params``          calibrated parameters: defaults, load, save, per-N values
``choice``          what ``algorithm="auto"`` believes and picks (pure)
``fit``             fitting α, β and measured/model ratios to measurements
``topology``        where ranks run (``Layout``) and what links cost (``Topology``)
``tuning``          what ``auto``'s timed trials try, and how it decides
``ledger``          ZeRO's memory and traffic per rank, by the lecture's formulas
``__main__``        ``python -m pycollective.model lecture|table|show|calibrate|check``
==================  ===========================================================

All of it is pure computation: the library's automatic choice uses it.
May import: ``runtime``, ``data``.  Measuring (``calibration``) and the command
line are measuring tools and live in ``pycollective.bench``
(``bench/_calibration.py``, ``bench/_model_cli.py``); their names here
(``calibrate``, ``measure_algorithms``, ``main``, ...) are loaded on first use
(PEP 562), so importing the model never imports the measuring tools.
"""

import importlib

from .choice import choose, explain, pays_overhead
from .fit import fit_alpha_beta, fit_corrections, fit_two_regimes
from .formulas import predict, predict_all, terms
from .lecture import LECTURE, lecture_cases, lecture_predict
from .params import (DEFAULTS, default_path, load_params, merge_calibration, params_for,
                     save_params)
from .topology import Layout, Topology

__all__ = [
    "DEFAULTS", "predict", "predict_all", "terms", "LECTURE", "lecture_predict",
    "lecture_cases", "choose", "explain", "pays_overhead", "load_params", "save_params", "params_for",
    "default_path", "merge_calibration", "fit_alpha_beta", "fit_two_regimes",
    "fit_corrections", "measure_algorithms", "calibrate", "ALGORITHM_COUNTS", "Layout", "Topology",
    "CALIBRATED_DTYPES", "main",
]

# Names of the measuring layer and the command line, loaded on first use.
# The measuring module is not named "calibrate": importing a submodule sets the
# package attribute of its name, which would then hide the function.
_LAZY = {"calibrate": "pycollective.bench._calibration",
         "measure_algorithms": "pycollective.bench._calibration",
         "ALGORITHM_COUNTS": "pycollective.bench._calibration",
         "CALIBRATED_DTYPES": "pycollective.bench._calibration",
         "main": "pycollective.bench._model_cli"}


def __getattr__(name):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
