"""The prefill/decode transfer runtime over torch.distributed (docs/pd.md): the link between the two
ranks (link), the prefill and decode halves of a disaggregated burst (sides) and each rank's joining,
lost-link exit and model fingerprint (rank). The engine's own half (export and import of a request's
KV blocks) is rltbench.engine.disagg; `rltbench pd` (rltbench/commands/pd) drives both.
"""
