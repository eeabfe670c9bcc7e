"""The console's sessions, CSRF tokens and notes (pure), the secret every router of a fleet derives
for them, and the language chosen from a browser's Accept-Language."""

import pytest

from llmgw.bus import EngineKeys, new_fleet_secret, node_secret
from llmgw.router.console.i18n import choose_language
from llmgw.router.console.session import BadSession, ExpiredSession, Sessions, same

NOW = 1_800_000_000.0


def test_a_session_opens_until_it_ends_with_a_csrf_token_of_its_own():
    sessions = Sessions(b"k" * 32, lifetime_s=3600)
    cookie, session = sessions.issue("0123456789abcdef", NOW)
    assert sessions.open(cookie, NOW + 3599) == session and session.key_id == "0123456789abcdef"
    _, second = sessions.issue("0123456789abcdef", NOW)
    assert second.csrf != session.csrf  # each sign-in its own token
    with pytest.raises(ExpiredSession):
        sessions.open(cookie, NOW + 3601)


@pytest.mark.parametrize(
    "tamper",
    [
        lambda c: c.replace("v1.", "v2.", 1),  # another version
        lambda c: c.replace(".0123456789abcdef.", ".fedcba9876543210."),  # another key's id
        lambda c: c[:-1] + ("A" if c[-1] != "A" else "B"),  # the mac changed
        lambda c: c.rpartition(".")[0] + ".é",  # a mac outside ASCII
        lambda c: "garbage",
        lambda c: "",
    ],
)
def test_a_tampered_cookie_is_not_a_session(tamper):
    sessions = Sessions(b"k" * 32, lifetime_s=3600)
    cookie, _ = sessions.issue("0123456789abcdef", NOW)
    with pytest.raises(BadSession):
        sessions.open(tamper(cookie), NOW)


def test_another_secret_opens_nothing_and_the_same_secret_on_another_router_opens_it():
    cookie, _ = Sessions(b"a" * 32, 60).issue("0123456789abcdef", NOW)
    with pytest.raises(BadSession):
        Sessions(b"b" * 32, 60).open(cookie, NOW)
    assert Sessions(b"a" * 32, 60).open(cookie, NOW).key_id == "0123456789abcdef"


def test_notes_read_back_and_a_forged_or_broken_one_is_none():
    sessions = Sessions(b"k" * 32, 60)
    note = sessions.note("ok", "smol is out of the catalog <b>")
    assert sessions.read_note(note) == ("ok", "smol is out of the catalog <b>")
    body, _, mac = note.partition(".")
    assert sessions.read_note(f"{body}x.{mac}") is None
    assert sessions.read_note(Sessions(b"z" * 32, 60).note("ok", "forged")) is None
    assert sessions.read_note("ünïcode.ß") is None and sessions.read_note("") is None


def test_a_token_compare_takes_any_text():
    assert same("abc", "abc") and not same("é", "abc") and not same("", "abc")


def test_routers_on_one_fleet_secret_derive_one_console_secret_and_a_node_or_no_secret_none():
    line = new_fleet_secret()
    one, two = EngineKeys.parse(line, "a"), EngineKeys.parse(line, "b")
    assert one.derive("console sessions") == two.derive("console sessions") != b""
    assert one.derive("console sessions") != one.derive("something else")
    assert EngineKeys.parse(node_secret(line, "n"), "n").derive("console sessions") == b""
    assert EngineKeys(b"").derive("console sessions") == b""


@pytest.mark.parametrize(
    ("chosen", "header", "lang"),
    [
        (None, "tr-TR,tr;q=0.9,en;q=0.8", "tr"),
        (None, "en;q=0.5, tr;q=0.9", "tr"),
        (None, "de-DE,de;q=0.9,en;q=0.3", "en"),
        (None, "fr, tr;q=0.1", "tr"),
        (None, "tr;q=bad, en;q=0.2", "en"),
        (None, None, "en"),
        ("tr", "en", "tr"),
        ("xx", "tr", "tr"),
    ],
)
def test_the_language_is_the_choice_made_else_the_browsers_best_that_we_speak(chosen, header, lang):
    assert choose_language(chosen, header) == lang
