"""Reusable widgets of the pages: charts and the run's phase timeline."""
