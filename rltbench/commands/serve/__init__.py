"""`rltbench serve`: the command that starts the server of rltbench.server (docs/serve.md)."""
