"""The money soak: seeded fault schedules over the fake clouds (``make soak``; a short seed set runs in the tests)."""
