"""Keys, projects and limits: the accounts and their NATS endpoints (`accounts`), the limit
counters in KV (`quota`), and the rules they follow (`counters`, `limits`)."""
