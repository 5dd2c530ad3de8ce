"""The pure domain of Rentune: data models and rules with no Qt and no I/O."""
