"""The new-fine-tune wizard: data → model and method → sizing → target → review and launch."""
