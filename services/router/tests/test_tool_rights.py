"""Which tools a key may use: its tenant's rule, then its project's, then its key's, each
narrowing (deny wins within a rule, a level without a rule lets all through); and the strings of
a tool's arguments found for the guardrails wherever they sit."""

import pytest

from llmgw.proto.tools import ToolRule
from llmgw.router.tools.leaves import TooDeep, leaves
from llmgw.router.tools.rights import listed_name, may_use, rule_key, split_name


def _rules(*rules: ToolRule) -> dict[str, ToolRule]:
    return {rule_key(r.tenant, r.applies_to, r.target): r for r in rules}


def test_with_no_rules_every_tool_of_the_tenant_passes():
    assert may_use({}, "acme", "default", "k1", "search__find")


def test_each_level_narrows_and_deny_wins_within_a_rule():
    rules = _rules(
        ToolRule(tenant="acme", deny=["*__delete*"]),
        ToolRule(tenant="acme", applies_to="project", target="research", allow=["search__*", "files__read"]),
        ToolRule(tenant="acme", applies_to="key", target="k2", allow=["search__*"], deny=["search__web"]),
    )
    assert may_use(rules, "acme", "research", "k1", "files__read")
    assert not may_use(rules, "acme", "research", "k1", "files__write")  # the project's allow
    assert not may_use(rules, "acme", "research", "k1", "search__delete_all")  # the tenant's deny
    assert may_use(rules, "acme", "sales", "k1", "files__write")  # another project: no rule of its own
    assert not may_use(rules, "acme", "research", "k2", "files__read")  # the key's allow
    assert not may_use(rules, "acme", "research", "k2", "search__web")  # the key's deny
    assert may_use(rules, "acme", "research", "k2", "search__find")


def test_a_rule_that_allows_nothing_lets_nothing_through_and_rules_stay_in_their_tenant():
    rules = _rules(ToolRule(tenant="acme", applies_to="key", target="k1", allow=[]))
    assert not may_use(rules, "acme", "default", "k1", "search__find")
    assert may_use(rules, "other", "default", "k1", "search__find")


def test_listed_names_say_their_server_and_split_back():
    assert listed_name("files", "read_file") == "files__read_file"
    assert split_name("files__read__all") == ("files", "read__all")
    assert split_name("files") is None and split_name("__x") is None and split_name("files__") is None


def test_every_string_of_a_value_is_found_where_it_sits_and_can_be_replaced():
    value = {"to": "ada@example.com", "n": 3, "cc": ["bob@example.com", {"note": "hi"}], "ok": True}
    places = leaves(value)
    assert sorted(h[k] for h, k in places) == ["ada@example.com", "bob@example.com", "hi"]
    for holder, key in places:
        holder[key] = holder[key].upper()
    assert value == {"to": "ADA@EXAMPLE.COM", "n": 3, "cc": ["BOB@EXAMPLE.COM", {"note": "HI"}], "ok": True}


def test_a_value_nested_past_the_deepest_is_refused_not_passed_unchecked():
    deep: list = ["bottom"]
    for _ in range(200):
        deep = [deep]
    with pytest.raises(TooDeep, match="deeper than 64 levels"):
        leaves(deep)
