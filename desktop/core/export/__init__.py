"""Pure rules of local delivery: whether an adapter fits its base, and which outputs can be made from them."""
