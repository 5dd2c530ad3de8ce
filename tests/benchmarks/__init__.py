"""Benchmarks, run by ``make bench`` (``python -m tests.benchmarks``); never collected by pytest."""
