"""Local stack and the main job (see the README)."""
