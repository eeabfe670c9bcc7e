"""What the fleet's events tell tenants, without I/O: the notice each event makes (a replica
failed, a model backing off or parked, a node lost, a mirror fetch failed, a machine upgraded or
its upgrade paused), which hooks it goes
to, how its body is signed, and which URLs a hook may have."""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
from collections.abc import Iterable, Mapping
from urllib.parse import urlsplit

from llmgw.proto import MirroredRepo, ModelStatus, NodeHealth, ReplicaReport
from llmgw.proto.hooks import Hook, Notice
from llmgw.proto.people import DEFAULT_TENANT, Tenant
from llmgw.proto.release import Release

__all__ = [
    "check_url",
    "for_budget",
    "for_fetch",
    "for_node",
    "for_release",
    "for_replica",
    "for_status",
    "notice_id",
    "receivers",
    "signature",
]


def for_replica(report: ReplicaReport, now: float) -> Notice | None:
    """A replica that failed (None: any other change)."""
    if report.state != "failed":
        return None
    text = f"replica {report.id} of {report.model} on node {report.node} failed: {report.error or 'no reason given'}"
    return Notice(kind="replica.failed", subject=report.id, text=text, time=now, model=report.model, node=report.node)


def for_status(was: ModelStatus | None, now_status: ModelStatus, now: float) -> Notice | None:
    """A model that went backing off or parked (None: no such change)."""
    state = now_status.state
    if state not in ("backing-off", "parked") or (was is not None and was.state == state):
        return None
    kind = "model.backing-off" if state == "backing-off" else "model.parked"
    text = f"model {now_status.model} is {state}: {now_status.reason or 'no reason given'}"
    return Notice(kind=kind, subject=now_status.model, text=text, time=now, model=now_status.model)


def for_node(node: str, was: NodeHealth | None, health: NodeHealth, now: float) -> Notice | None:
    """A node the scheduler lost (None: no such change)."""
    if health.state != "lost" or (was is not None and was.state == "lost"):
        return None
    text = f"node {node} is lost: silent for {health.silent_s:.0f} s; its replicas are placed elsewhere"
    return Notice(kind="node.lost", subject=node, text=text, time=now, node=node)


def for_fetch(repo: MirroredRepo, now: float) -> Notice | None:
    """A mirror fetch that failed (None: any other progress)."""
    if repo.state != "failed":
        return None
    text = f"the mirror's fetch of {repo.repo}@{repo.revision} failed"
    return Notice(kind="mirror.fetch-failed", subject=f"{repo.repo}@{repo.revision}", text=text, time=now)


def for_release(release: Release, now: float) -> Notice | None:
    """A machine that runs the release it was upgraded to, or whose upgrade paused (None: a
    step under way)."""
    node, version = release.node, release.version
    if release.state == "done":
        text = f"node {node} runs {version} now (before it: {release.previous or 'nothing'})"
    elif release.state == "failed":
        text = f"node {node}'s upgrade to {version} paused: {release.error}"
    else:
        return None
    return Notice(kind="upgrade.progress", subject=f"{node}@{version}", text=text, time=now, node=node)


def for_budget(what: str, tenant: str, used: int, limit: int | None, period: str, now: float) -> Notice | None:
    """A budget (`what`: "key 'ci'", "tenant 'lab'") 80% used or spent in `period` ("day
    2026-12-05", "month 2026-12"); None: neither, or no budget."""
    if not limit or used < 0.8 * limit:
        return None
    spent = used >= limit
    kind = "budget.spent" if spent else "budget.80"
    said = "has spent" if spent else "has used over 80% of"
    text = (
        f"{what} {said} its {limit:,} tokens for the {period}: requests get 429 until it ends"
        if spent
        else (f"{what} {said} its {limit:,} tokens for the {period}")
    )
    return Notice(kind=kind, subject=what, text=text, time=now, tenant=tenant, period=period)


def notice_id(notice: Notice) -> str:
    """One name for a notice, whichever router saw it (the same event seen twice is sent once; a
    budget's once in its period)."""
    once = notice.period or str(int(notice.time // 60))
    return hashlib.sha256(f"{notice.kind}|{notice.subject}|{notice.text}|{once}".encode()).hexdigest()


def receivers(notice: Notice, hooks: Iterable[Hook], tenants: Mapping[str, Tenant]) -> list[Hook]:
    """The hooks `notice` goes to: those that chose its kind, of the tenants that may use its
    model, or, for the fleet's own events, of the default tenant (its operators')."""
    chosen = []
    for hook in hooks:
        if notice.kind not in hook.events:
            continue
        if notice.tenant:
            if hook.tenant != notice.tenant:
                continue
        elif notice.model:
            allowed = tenants[hook.tenant].models if hook.tenant in tenants else []
            if allowed and notice.model not in allowed:
                continue
        elif hook.tenant != DEFAULT_TENANT:
            continue
        chosen.append(hook)
    return chosen


def signature(secret: str, timestamp: str, body: bytes) -> str:
    """The `X-Llmgw-Signature` header: HMAC-SHA256 of "<timestamp>.<body>" under the hook's secret."""
    return "sha256=" + hmac.new(secret.encode(), timestamp.encode() + b"." + body, hashlib.sha256).hexdigest()


def check_url(url: str, own_ports: set[int]) -> str:
    """Why `url` cannot be a hook's ("" where it can): not http(s), no host, or one of the fleet's
    own admin ports on this machine (a hook must not be turned on llmgw itself)."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"'{url[:100]}' is not an http:// or https:// URL with a host"
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        return f"'{url[:100]}' has a port that is not a number from 1 to 65535"
    host = parts.hostname
    try:
        local = (
            host == "localhost" or ipaddress.ip_address(host).is_loopback or ipaddress.ip_address(host).is_unspecified
        )
    except ValueError:
        local = False
    if local and port in own_ports:
        return f"{url[:100]} points at llmgw's own port {port} on this machine: give the receiver's address"
    return ""
