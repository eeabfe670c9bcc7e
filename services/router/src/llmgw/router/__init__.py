"""The router: the OpenAI-compatible gateway with keys, limits, usage and the admin API."""
