"""Guardrails: `find` (what a text holds: personal data, secrets, a tenant's patterns), `redact`
(placeholders in, values back out, also across a stream's chunks), `policies` (which applies to a
request, and what its checks do to it), `store` (the policies bucket and its endpoints)."""
