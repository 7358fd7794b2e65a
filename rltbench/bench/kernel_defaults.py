"""The kernels command's default token counts and its CPU caps, apart from kernel_sweep.py so that
`rltbench kernels --help` can show them without loading torch and Triton."""

DEFAULT_TOKENS = (1, 8, 128, 4096)
CPU_MAX_TOKENS = 8  # without a GPU the cases run through the Triton interpreter: small shapes only
CPU_MAX_WIDTH = 512
