"""Runs as data: the human-editable run spec and the run state machine."""
