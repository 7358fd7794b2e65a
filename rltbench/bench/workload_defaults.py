"""The workloads' defaults (a burst's lengths, the session traces), apart from workload.py (numpy) so
that every command's --help can name them without importing numpy."""

BURST_INPUT_LEN = 512  # a burst's prompt and output lengths where the model's context holds them
BURST_OUTPUT_LEN = 128
DEFAULT_TRACE = "mooncake"  # the session trace of a model whose context holds its records
SMALL_MODEL_TRACE = "mooncake-tiny"  # the preset whose records fit a tiny model (workloads/presets.json)
