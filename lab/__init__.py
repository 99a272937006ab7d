"""Tools for measuring rootrank from the outside (not part of the shipped package)."""
