"""Sharing a fine-tune: the adapter and its exports to a Hugging Face Hub repo, with a model card from the run."""
