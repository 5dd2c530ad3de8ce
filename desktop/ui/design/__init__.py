"""Rentune's design system: one palette per theme, one stylesheet, one icon set, shared building blocks."""
