"""The subjects by name, as wave 1 wrote them; being replaced by the endpoint tables and events in
the service modules (`catalog.MODEL_PUT.subject()`), and removed when no caller is left."""

from __future__ import annotations

__all__ = ["Subjects"]

VERSION = "v1"
_P = f"llmgw.{VERSION}"


class Subjects:
    """Every subject llmgw uses; per-node and per-id subjects are methods."""

    CATALOG_MODEL_PUT = f"{_P}.catalog.model.put"
    CATALOG_MODEL_GET = f"{_P}.catalog.model.get"
    CATALOG_MODEL_LIST = f"{_P}.catalog.model.list"
    CATALOG_MODEL_REMOVE = f"{_P}.catalog.model.remove"
    CATALOG_MODEL_CHANGE = f"{_P}.catalog.model.change"
    CATALOG_MODEL_PURGE = f"{_P}.catalog.model.purge"

    SCHEDULER_NODE_REGISTER = f"{_P}.scheduler.node.register"
    SCHEDULER_REPLICA_LIST = f"{_P}.scheduler.replica.list"
    SCHEDULER_NODE_LIST = f"{_P}.scheduler.node.list"
    SCHEDULER_MODEL_STATUS = f"{_P}.scheduler.model.status"

    MIRROR_FILE_STAT = f"{_P}.mirror.file.stat"
    MIRROR_FILE_LIST = f"{_P}.mirror.file.list"
    MIRROR_FILE_DELETE = f"{_P}.mirror.file.delete"

    AGENT_WEIGHTS_DELETE = f"{_P}.agent.weights.delete"
    """Every agent answers (each in its own queue group): files deleted from its cache."""
    AGENT_WEIGHTS_COLLECT = f"{_P}.agent.weights.collect"
    """Every agent answers: cached files no model uses, deleted."""

    ROUTER_KEY_CREATE = f"{_P}.router.key.create"
    ROUTER_KEY_LIST = f"{_P}.router.key.list"
    ROUTER_KEY_REVOKE = f"{_P}.router.key.revoke"
    ROUTER_PROJECT_PUT = f"{_P}.router.project.put"
    ROUTER_USAGE_SUM = f"{_P}.router.usage.sum"

    EVT_HEARTBEAT_ALL = f"{_P}.evt.node.heartbeat.*"
    EVT_REPLICA_ALL = f"{_P}.evt.replica.*"
    EVT_MODEL_ALL = f"{_P}.evt.model.*"
    EVT_USAGE_ALL = f"{_P}.evt.usage.>"
    """Every request's usage (the usage stream holds these)."""

    @staticmethod
    def evt_usage(project: str, model: str) -> str:
        """Where the router publishes a request's usage."""
        return f"{_P}.evt.usage.{project}.{model}"

    @staticmethod
    def heartbeat(node: str) -> str:
        """Where the agent of `node` publishes its heartbeats."""
        return f"{_P}.evt.node.heartbeat.{node}"

    @staticmethod
    def replica_event(replica_id: str) -> str:
        """Where a replica's state changes are published."""
        return f"{_P}.evt.replica.{replica_id}"

    @staticmethod
    def model_event(name: str) -> str:
        """Where a change to model `name` is published."""
        return f"{_P}.evt.model.{name}"

    @staticmethod
    def agent_replica_start(node: str) -> str:
        """Asks the agent of `node` to start a replica."""
        return f"{_P}.agent.{node}.replica.start"

    @staticmethod
    def agent_worker_start(node: str) -> str:
        """Asks the agent of `node` to start its worker of a multi-node replica."""
        return f"{_P}.agent.{node}.worker.start"

    @staticmethod
    def agent_worker_stop(node: str) -> str:
        """Asks the agent of `node` to stop its worker of a multi-node replica."""
        return f"{_P}.agent.{node}.worker.stop"

    @staticmethod
    def agent_replica_stop(node: str) -> str:
        """Asks the agent of `node` to stop a replica."""
        return f"{_P}.agent.{node}.replica.stop"
