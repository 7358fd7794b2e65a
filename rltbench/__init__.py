"""rltbench: benchmarking and profiling suite for looped language models."""
__version__ = "0.1.0"
