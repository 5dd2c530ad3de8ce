"""Tests of the GPU cloud provider clients against their fake servers, and the market across them."""
