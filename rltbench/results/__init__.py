"""Results layer shared by all commands: run directories, manifests with provenance, atomic files."""

from rltbench.results.rundir import RunDir, atomic_write_text, dumps

__all__ = ["RunDir", "atomic_write_text", "dumps"]
