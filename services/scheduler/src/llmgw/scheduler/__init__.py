"""The scheduler: inventory, placement and the reconcile loop that keeps replicas as wanted."""
