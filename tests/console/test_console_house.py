"""The console's house rules, checked on its files and on every page as served: each string a
template shows comes from the message files (in both languages), every input has a label,
headings come in order, the warning colours read against their background (WCAG AA, 4.5:1), and
no page is cached or framed."""

import re
from html.parser import HTMLParser
from importlib import resources
from typing import get_args

import pytest

from llmgw.proto.people import AuditArea
from llmgw.router.console.i18n import LANGUAGES, Messages

CONSOLE = resources.files("llmgw.router.console")
TEMPLATES = sorted((p.name, p.read_text(encoding="utf-8")) for p in CONSOLE.joinpath("templates").iterdir())
PAGES = ["/console/models", "/console/mirror", "/console/fleet", "/console/keys", "/console/usage"]
"""The pages of the navigation bar; each is drawn in both languages below."""
_SHOWN_ATTRIBUTES = ("title", "placeholder", "aria-label", "alt", "data-confirm")


def test_the_message_files_load_with_both_languages_and_the_same_placeholders():
    table = Messages.load().table  # raises naming the key that breaks a rule
    assert table and all(set(words) == set(LANGUAGES) for words in table.values())
    same = [key for key, words in table.items() if words["en"] == words["tr"] and not key.startswith("lang.")]
    assert len(same) < len(table) // 10, f"messages not translated (en == tr): {same}"


def test_every_audit_area_has_its_words():
    """The audit page names each entry's area in words: an area added to the proto needs them."""
    table = Messages.load().table
    missing = [a for a in get_args(AuditArea) if f"audit.area.{a}" not in table]
    assert not missing, f"add audit.area.* to messages/people.json for {missing}"


@pytest.mark.parametrize(("name", "text"), TEMPLATES, ids=[name for name, _ in TEMPLATES])
def test_a_template_shows_no_words_of_its_own(name, text):
    """Words come through t(...) or from data; what is left once the template's expressions,
    tags, scripts and styles are taken out has no letters (the brand name aside)."""
    bare = re.sub(r"{#.*?#}|{{.*?}}|{%.*?%}", " ", text, flags=re.S)
    bare = re.sub(r"<(script|style)\b.*?</\1>", " ", bare, flags=re.S | re.I)
    for attribute in _SHOWN_ATTRIBUTES:
        for value in re.findall(rf'{attribute}="([^"]*)"', bare):
            assert not re.search(r"[^\W\d_]", value), f'{name}: {attribute}="{value}" is not from the messages'
    words = re.sub(r"<[^>]*>", " ", bare).replace("llmgw", " ")
    letters = re.findall(r"[^\W\d_]{2,}", words)
    assert not letters, f"{name} shows words not taken from the message files: {letters[:8]}"


@pytest.mark.parametrize(("name", "text"), TEMPLATES, ids=[name for name, _ in TEMPLATES])
def test_every_message_a_template_names_is_in_the_files(name, text):
    table = Messages.load().table
    named = re.findall(r"""\bt\(\s*['"]([\w.-]+)['"]""", text)
    # a name ending in '.' is the first part of one drawn from data (`t('state.' ~ s.state)`)
    missing = [key for key in named if key not in table]
    missing = [key for key in missing if not (key.endswith(".") and any(k.startswith(key) for k in table))]
    assert not missing, f"{name} names messages that are in no file: {missing}"


def _contrast(fg: str, bg: str) -> float:
    def luminance(colour: str) -> float:
        channels = [int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)]
        linear = [c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4 for c in channels]
        return 0.2126 * linear[0] + 0.7152 * linear[1] + 0.0722 * linear[2]

    light, dark = sorted((luminance(fg), luminance(bg)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def test_the_warning_colours_read_against_their_backgrounds():
    css = CONSOLE.joinpath("static", "console.css").read_text()
    colour = dict(re.findall(r"--([\w-]+):\s*(#[0-9a-fA-F]{6})", css))
    pairs = [("warn", "warn-bg"), ("error", "error-bg"), ("warn", "bg"), ("error", "bg"), ("ok", "panel")]
    pairs += [("muted", "bg"), ("muted", "panel"), ("accent", "bg"), ("fg", "bg")]
    low = {f"{fg} on {bg}": round(_contrast(colour[fg], colour[bg]), 2) for fg, bg in pairs}
    assert all(ratio >= 4.5 for ratio in low.values()), f"under 4.5:1 (WCAG AA): {low}"


class _Page(HTMLParser):
    """What the accessibility checks need of a page: its inputs and labels, its headings."""

    def __init__(self) -> None:
        super().__init__()
        self.inputs: list[tuple[str, dict]] = []
        self.label_for: set[str] = set()
        self.headings: list[int] = []
        self._in_label = 0

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "label":
            self._in_label += 1
            if attrs.get("for"):
                self.label_for.add(attrs["for"])
        elif tag in ("input", "select", "textarea"):
            if attrs.get("type") not in ("hidden", "submit", "button"):
                self.inputs.append((tag, {**attrs, "_wrapped": self._in_label > 0}))
        elif re.fullmatch(r"h[1-6]", tag):
            self.headings.append(int(tag[1]))

    def handle_endtag(self, tag):
        if tag == "label":
            self._in_label -= 1


def check_accessible(path: str, html: str) -> None:
    """Every input labelled; one h1, first; no heading level skipped going down."""
    page = _Page()
    page.feed(html)
    unlabelled = [
        (tag, a.get("name"))
        for tag, a in page.inputs
        if not (a["_wrapped"] or a.get("id") in page.label_for or a.get("aria-label"))
    ]
    assert not unlabelled, f"{path}: inputs without a label: {unlabelled}"
    assert page.headings[:1] == [1] and page.headings.count(1) == 1, f"{path}: headings {page.headings}"
    jumps = [(a, b) for a, b in zip(page.headings, page.headings[1:], strict=False) if b > a + 1]
    assert not jumps, f"{path}: heading levels skipped: {jumps} in {page.headings}"


async def test_every_page_in_both_languages_has_labels_headings_in_order_and_is_not_cached(stack):
    browser = await stack.signed_in()
    for lang in LANGUAGES:
        await browser.get(f"/console/lang?to={lang}&next=/console/models")
        for path in [*PAGES, "/console/signin"]:
            page = await browser.get(path)
            assert page.status_code == 200, (path, page.text[:500])
            assert f'<html lang="{lang}">' in page.text
            assert page.headers["cache-control"] == "no-store" and page.headers["x-frame-options"] == "DENY"
            check_accessible(f"{path} ({lang})", page.text)


def test_nothing_is_shown_unescaped_but_the_charts_which_escape_their_own_labels():
    """Jinja escapes every value; the one way around it is Markup, made only by charts.py (its SVG,
    built from escaped labels: services/router/tests/test_charts.py)."""
    unescaped = [name for name, text in TEMPLATES if re.search(r"\|\s*safe\b|autoescape\s+false", text)]
    assert not unescaped, f"templates that show a value unescaped: {unescaped}"
    makers = sorted(
        p.name
        for p in CONSOLE.iterdir()
        if p.name.endswith(".py") and re.search(r"\bMarkup\(", p.read_text(encoding="utf-8"))
    )
    assert makers == ["charts.py"], f"Markup made outside charts.py: {makers}"
