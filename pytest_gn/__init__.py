"""pytest-gn: a pytest plugin that validates GroupNorm implementations on the GPU at hand and,
through the arch sweep, on GPU profiles you do not own. The plugin lives in `pytest_gn.plugin`."""

__all__: list[str] = []
