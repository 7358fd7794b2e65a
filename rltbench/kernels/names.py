"""The names of the op cases (rltbench.kernels.cases: one case per name), torch-free so that
`rltbench kernels --help` can list them without loading torch and Triton."""

OPS: list[str] = [
    "rmsnorm",
    "rmsnorm_huginn",
    "rmsnorm_residual",
    "add_rmsnorm_huginn",
    "rope_neox",
    "rope_interleaved",
    "silu_mul",
]
