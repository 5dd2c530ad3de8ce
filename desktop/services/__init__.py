"""Async and blocking I/O for Rentune, free of Qt: paths, settings, secrets, logs, providers, SSH, runs."""
