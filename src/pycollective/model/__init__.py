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
``calibration``     measuring on this machine, through ``pycollective.allreduce``
``__main__``        ``python -m pycollective.model lecture|table|show|calibrate|check``
==================  ===========================================================

Everything but ``calibration`` is pure computation and sits below the
collectives in the import graph (the library's automatic choice uses it);
``calibration`` measures through the public collectives and so sits above
them.  It is therefore loaded on first use of its names (PEP 562), not when
``pycollective.model`` is imported, which would be an import cycle.
"""

import importlib

from .choice import choose, explain
from .fit import fit_alpha_beta, fit_corrections, fit_two_regimes
from .formulas import predict, predict_all, terms
from .lecture import LECTURE, lecture_cases, lecture_predict
from .params import (DEFAULTS, default_path, load_params, merge_calibration, params_for,
                     save_params)
from .topology import Layout, Topology

__all__ = [
    "DEFAULTS", "predict", "predict_all", "terms", "LECTURE", "lecture_predict",
    "lecture_cases", "choose", "explain", "load_params", "save_params", "params_for",
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
