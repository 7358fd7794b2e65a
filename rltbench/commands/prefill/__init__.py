"""`rltbench prefill`: a burst of long prompts under the engine's packed, chunked prefill against
one-request-per-step prefill (the scheduler's max_prefill_seqs=1), with prefill step time, TTFT and
token identity between the two policies.

Why a command of its own and not an e2e preset: e2e interleaves kernel arms on one scheduler policy;
here the kernel arm is fixed and the scheduler policy is what alternates (A B A' / A' B A, with an A/A
copy of the packed policy), and the figures are prefill steps, not decode throughput.
Entry points: `rltbench.commands.prefill.cli.prefill_command`, `rltbench.commands.prefill.report.render`.
"""
