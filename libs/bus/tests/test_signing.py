"""Signed requests, without NATS: what a signature covers, and each way one is refused."""

import pytest

from llmgw.bus import CredentialsError, SignatureError, Signer, Verifier, new_identity, public_key
from llmgw.bus._signing import SIGNATURE, SIGNED_AT

SUBJECT = "llmgw.v1.agent.a.replica.stop"
NOW = 1_800_000_000.0


@pytest.fixture
def keys():
    identity = new_identity("scheduler")
    return Signer(identity.seed), Verifier(identity.public)


def test_a_request_signed_for_its_subject_and_payload_is_taken_once(keys):
    signer, verifier = keys
    headers = signer.headers(SUBJECT, b'{"id": "r1"}', NOW)
    verifier.check(SUBJECT, b'{"id": "r1"}', headers, NOW + 1)
    with pytest.raises(SignatureError, match="seen before: replayed"):
        verifier.check(SUBJECT, b'{"id": "r1"}', headers, NOW + 2)


@pytest.mark.parametrize(
    ("subject", "payload", "now", "says"),
    [
        ("llmgw.v1.agent.b.replica.stop", b'{"id": "r1"}', NOW, "not signed by the scheduler's key"),
        (SUBJECT, b'{"id": "r2"}', NOW, "not signed by the scheduler's key"),
        (SUBJECT, b'{"id": "r1"}', NOW + 121, "121 s away from now, more than 120 s"),
        (SUBJECT, b'{"id": "r1"}', NOW - 121, "121 s away from now"),
    ],
)
def test_a_signature_for_another_subject_payload_or_time_is_refused(keys, subject, payload, now, says):
    signer, verifier = keys
    with pytest.raises(SignatureError, match=says):
        verifier.check(subject, payload, signer.headers(SUBJECT, b'{"id": "r1"}', NOW), now)


def test_no_signature_another_keys_or_garbage_is_refused(keys):
    signer, verifier = keys
    other = Signer(new_identity("router").seed)
    with pytest.raises(SignatureError, match="not signed; only the scheduler may ask it"):
        verifier.check(SUBJECT, b"{}", {}, NOW)
    with pytest.raises(SignatureError, match="not signed by the scheduler's key"):
        verifier.check(SUBJECT, b"{}", other.headers(SUBJECT, b"{}", NOW), NOW)
    good = signer.headers(SUBJECT, b"{}", NOW)
    for bad in ({**good, SIGNATURE: "%%%"}, {**good, SIGNED_AT: "nan"}, {**good, SIGNED_AT: "soon"}):
        with pytest.raises(SignatureError):
            verifier.check(SUBJECT, b"{}", bad, NOW)


def test_what_is_remembered_against_replays_is_only_what_is_inside_the_window(keys):
    signer, verifier = keys
    for i in range(50):
        verifier.check(SUBJECT, b"%d" % i, signer.headers(SUBJECT, b"%d" % i, NOW + i), NOW + i)
    verifier.check(SUBJECT, b"late", signer.headers(SUBJECT, b"late", NOW + 500), NOW + 500)
    assert len(verifier._seen) == 1


def test_a_public_key_is_given_as_itself_or_as_a_file_and_a_wrong_one_says_so(tmp_path):
    public = new_identity("scheduler").public
    (tmp_path / "scheduler.pub").write_text(public + "\n")
    assert public_key(public) == public_key(str(tmp_path / "scheduler.pub")) == public
    with pytest.raises(CredentialsError, match="checksum does not match"):
        public_key(public[:-2] + ("AB" if public[-2:] != "AB" else "CD"))
    with pytest.raises(CredentialsError, match="No such file"):
        public_key(str(tmp_path / "none.pub"))
    (tmp_path / "seed.pub").write_text(new_identity("scheduler").seed)
    with pytest.raises(CredentialsError, match="not a user's public nkey"):
        public_key(str(tmp_path / "seed.pub"))
