"""`rltbench capacity`: KV bytes per token per model and KV layout, what a memory budget admits (requests
at once, tokens), beside the per-application baseline, and a measured burst at the largest C.

Entry points: `rltbench.commands.capacity.cli.capacity_command` (CLI) and
`rltbench.commands.capacity.report.render` (`rltbench report DIR`).
"""
