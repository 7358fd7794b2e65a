"""`rltbench profile`: kernels per decode step/token, GPU time per token, class breakdown, floors.

Modules: classify (kernel classes from names), trace (chrome-trace parsing), counting (per-step
counts, breakdown, graph-vs-profiler verdict), graph_nodes (CUDA-graph node census), compat
(torch.profiler differences), floors (GEMM, weight-bytes and KV-bytes floors), collect (the measurements),
report (`render` for `rltbench report`), cli (`profile_command`).
"""
