"""Runs: the engine that drives a fine-tune on a machine, its store, the event mirror, the manager, drafts."""
