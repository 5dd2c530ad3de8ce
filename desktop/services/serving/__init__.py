"""Serving a model Rentune made: an OpenAI-compatible endpoint on this computer."""
