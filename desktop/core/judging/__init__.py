"""Judging a fine-tune against its base on held-out rows: task checks and the verdict (pure)."""
