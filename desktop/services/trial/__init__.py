"""A trial on this computer before anything is rented: a few dozen steps on a slice of the data.

See :mod:`desktop.core.runs.trial`.
"""
