"""I/O for Rentune, free of Qt, one sub-package per step of the flow.

``platform`` (this computer: paths, settings, secrets, logs, files, programs, the doctor's checks) → ``models``
(a model's configuration) → ``data`` (checking and preparing a dataset) and ``machines`` (SSH machines, probing,
run keys) → ``runs`` (the engine that drives a fine-tune, its store and event mirror). ``providers``, ``billing``
and ``local`` hold the cloud, cost and local-tool work. Lower packages never import higher ones (import-linter).
"""
