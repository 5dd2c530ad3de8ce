"""Local model tools: merging an adapter, validating with MLX, quantising to GGUF, chatting with the result.

Empty until the local delivery work lands; the import contracts already keep it independent of the providers.
"""
