"""evaluation (see the README)."""
