"""Keys, projects and limits: the accounts and their NATS endpoints (`accounts`), admission
against limits (`quota`) on the counters in KV (`counting`), and the rules they follow
(`counters`, `limits`)."""
