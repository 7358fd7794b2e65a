"""Backends: send requests to the model under test and get its streamed tokens back, one record per
request. `engine` drives the in-process engine (every arm in one process), `openai` drives
OpenAI-compatible servers (one server per arm); both follow `base.Backend`, which is what the e2e load,
the GSM8K gate and the serve soak run on."""
