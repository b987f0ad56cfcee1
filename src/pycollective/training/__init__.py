"""Data-parallel training on the collectives.

``bucketing`` gradient buckets (``GradientBuckets``); ``optimizer``
``broadcast_parameters``, ``check_replicas`` and ``DistributedOptimizer``.
ZeRO is its own public package, ``pycollective.zero``, built on these.

May import: ``comm``, ``collectives``, ``data``, ``compression``, ``_errors``.
"""

from .bucketing import GradientBuckets
from .optimizer import DistributedOptimizer, broadcast_parameters, check_replicas

__all__ = ["GradientBuckets", "DistributedOptimizer", "broadcast_parameters", "check_replicas"]
