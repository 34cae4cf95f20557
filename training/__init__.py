"""training (see the README)."""
