"""Datasets: reading, checking, counting tokens and preparing a chat dataset for upload."""
