"""`rltbench pd`: prefill/decode disaggregation across two processes (docs/pd.md)."""
