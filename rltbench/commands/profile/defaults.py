"""The profile command's defaults, apart from collect.py so that `rltbench profile --help` can show
them without loading torch and the engine."""

DEFAULT_CONTEXT = 512  # cached tokens per sequence when --context is not given (and the model holds them)
