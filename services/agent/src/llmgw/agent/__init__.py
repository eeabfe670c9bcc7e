"""The agent: one per node; reports the node, runs its engines and workers, caches weights."""
