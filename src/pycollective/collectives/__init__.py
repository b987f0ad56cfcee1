"""The call path: the public collectives and what every call goes through.

``api`` the public functions (each checks its own arguments); ``call`` one
call's prepare, run and leave; ``plans`` the plans of repeated call shapes;
``agree`` the cross-rank agreement; ``auto``, ``probe`` (the model's parameters measured on
first use) and ``choose`` the automatic
choice of algorithm; ``options`` what a caller sets and asks before calling;
``allocate`` ``shared_empty`` and ``release``; ``barrier`` the barrier; ``device`` where device
buffers enter the public functions (native, staged, or an error).

May import: ``data``, ``runtime``, ``node``, ``model``, ``device``, ``compression``,
``timeline``, ``_errors``, and the ``algorithms`` package (importing it registers them;
``api`` and ``options`` only).
"""
