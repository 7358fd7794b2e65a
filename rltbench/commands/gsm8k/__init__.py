"""`rltbench gsm8k`: the GSM8K quality gate (paired accuracy of each kernel arm vs the torch arm).

Entry points: `rltbench.commands.gsm8k.cli.gsm8k_command` (the typer command) and
`rltbench.commands.gsm8k.report.render` (for `rltbench report DIR`).
Statistics: `rltbench.results.gsm8k_stats`.
Nothing here imports lm-eval at package import time.
"""
