"""Tests of the GPU cloud clients against fake servers that follow the documented APIs."""
