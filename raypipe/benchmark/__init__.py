"""``raypipe bench``: raypipe against the loaders users would pick instead, in one run."""

from raypipe.benchmark.measure import MemorySampler, Result, measure_epochs

__all__ = ["MemorySampler", "Result", "measure_epochs"]
