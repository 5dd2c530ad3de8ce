"""Rentune: fine-tune LLMs on rented GPUs without paying for idle time.

Packages:
    desktop.core: the pure domain (sizing, run specs, dataset rules, costs). No Qt, no I/O.
    desktop.services: I/O without Qt, one sub-package per step: platform, data, models, machines, runs.
    desktop.ui: the PySide6 desktop app; the only package that imports Qt.
    desktop.cli: the headless command line, on the same services.
"""

__version__ = "0.1.0"
