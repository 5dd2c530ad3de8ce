"""Models: resolving a base model's configuration and sizing a fine-tune of it."""
