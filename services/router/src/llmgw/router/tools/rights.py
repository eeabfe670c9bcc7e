"""Which tools a key may use, without I/O: a tool passes its tenant's rule, then its project's,
then its key's (a level with no rule lets everything through), and within a rule it must match
an `allow` pattern and no `deny` one. Tools are listed as `<server>__<tool>`, so two servers'
tools of one name never collide."""

from __future__ import annotations

from collections.abc import Mapping
from fnmatch import fnmatchcase

from llmgw.proto.tools import SEPARATOR, ToolRule

__all__ = ["listable", "listed_name", "may_use", "rule_key", "split_name"]


def listed_name(server: str, tool: str) -> str:
    """The name a server's tool is listed under."""
    return f"{server}{SEPARATOR}{tool}"


def listable(server: str) -> bool:
    """Whether a server's tools can be listed under its name: one holding `SEPARATOR` or ending
    in '_' would meet another's (`a__b` + `c` and `a` + `b__c`; `a_` + `b` and `a` + `_b`)."""
    return SEPARATOR not in server and not server.endswith("_")


def split_name(name: str) -> tuple[str, str] | None:
    """The server and tool a listed name stands for (None: not a listed name)."""
    server, sep, tool = name.partition(SEPARATOR)
    return (server, tool) if sep and server and tool else None


def rule_key(tenant: str, applies_to: str, target: str) -> str:
    """Where a rule is kept: `<tenant>.<tenant|project|key>.<target or _>`."""
    return f"{tenant}.{applies_to}.{target or '_'}"


def _passes(rule: ToolRule | None, name: str) -> bool:
    if rule is None:
        return True
    allowed = any(fnmatchcase(name, p) for p in rule.allow)
    return allowed and not any(fnmatchcase(name, p) for p in rule.deny)


def may_use(rules: Mapping[str, ToolRule], tenant: str, project: str, key_id: str, name: str) -> bool:
    """Whether a key (of `tenant`, in `project`) may use the tool listed as `name`."""
    levels = (("tenant", ""), ("project", project), ("key", key_id))
    return all(_passes(rules.get(rule_key(tenant, kind, target)), name) for kind, target in levels)
