"""Local model tools, on the user's computer: base model, fit check, merge, GGUF, MLX, chat and comparison.

Heavy libraries are imported inside the functions (or child processes) that use them.
"""
