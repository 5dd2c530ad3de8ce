"""Evaluating a fine-tune against its base: task checks on held-out rows, the verdict, and its report."""
