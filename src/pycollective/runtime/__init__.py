"""What every call runs inside: settings, per-communicator context, bounded waits, the registry.

``env`` every ``PYCOLLECTIVE_*`` environment setting; ``settings`` the run-time
settings that must match across ranks; ``context`` a communicator's private
``Dup``, lock, call numbers, scratch and typed cache; ``watch`` bounded waits,
the side channel, call fingerprints; ``registry`` the algorithms and their
costs; ``root`` one rank loads, every rank gets the value or the error;
``threads`` which thread a call comes from (calls pair across ranks by it);
``hosts`` where each rank runs, for messages that name a lost node; ``machine`` the
processor's name and caches, as the system reports them.

May import: ``data``, ``timeline``, ``_errors``.
"""
