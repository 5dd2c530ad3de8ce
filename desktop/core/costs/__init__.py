"""Money as the user plans it: what renting and owning cost (pure)."""
