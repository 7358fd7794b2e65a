"""`rltbench gsm8k`: the GSM8K quality gate (paired accuracy of each kernel arm vs the torch arm).

Entry points: `rltbench.gsm8k.cli.gsm8k_command` (the typer command) and
`rltbench.gsm8k.report.render` (for `rltbench report DIR`). Statistics: `rltbench.gsm8k.stats`.
Nothing here imports lm-eval at package import time.
"""
