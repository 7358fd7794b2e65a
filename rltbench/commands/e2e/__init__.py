"""`rltbench e2e`: serving loads (burst, session replay) across kernel arms on the in-process engine or
OpenAI-compatible servers, with TTFT/TPOT/ITL/E2E, throughput, token identity and paired statistics.

Contract: docs/contracts/e2e.md. Entry points: `rltbench.commands.e2e.cli.e2e_command` (CLI) and
`rltbench.commands.e2e.report.render` (`rltbench report DIR`).
"""
