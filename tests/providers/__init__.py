"""Tests of the GPU cloud providers and the market across them."""
