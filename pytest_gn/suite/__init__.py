"""The validation suite collected by `pytest --gn-arch-sweep` (needs no test files of the user's)."""
