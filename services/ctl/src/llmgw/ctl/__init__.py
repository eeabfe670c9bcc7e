"""The operator's command line: `llmgw ctl`, `llmgw up`, `llmgw plan`, `llmgw service`."""
