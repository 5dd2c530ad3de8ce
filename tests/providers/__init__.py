"""Tests of the GPU cloud provider clients against their fake servers."""
