"""The keyed digest (eden_serve.wire.keyed): a payload tagged under the shared key, and what a keyed
edge refuses."""

from __future__ import annotations

import hashlib

import pytest

from eden_serve import wire
from eden_serve.config import PRESETS
from eden_serve.errors import BadInputError, UnauthenticPayloadError
from eden_serve.model import synthetic
from eden_serve.wire import keyed
from eden_serve.wire.envelope import DIGEST_SIZE

CONFIG = PRESETS["tiny"]
KEY = b"0123456789abcdef0123456789abcdef"


@pytest.fixture(scope="module")
def payload() -> bytes:
    return wire.encode(synthetic.chunk(CONFIG, (64, 96), frames=3), CONFIG)


def forge(payload: bytes) -> bytes:
    """The payload with one header value changed and the envelope's BLAKE2b digest recomputed, as
    anyone can: the unkeyed envelope takes it as intact."""
    body = payload[:-DIGEST_SIZE].replace(b'"seeds":[0,1]', b'"seeds":[7,1]', 1)
    assert body != payload[:-DIGEST_SIZE]
    return body + hashlib.blake2b(body, digest_size=DIGEST_SIZE).digest()


def test_a_tagged_payload_opens_to_the_payload(payload):
    tagged = keyed.sign(payload, KEY)
    assert tagged[:8] == keyed.TAG_MAGIC and len(tagged) == len(payload) + keyed.TAGGED_PREFIX
    assert bytes(keyed.verify(tagged, KEY)) == payload
    assert wire.decode(keyed.verify(tagged, KEY), CONFIG).seeds == [0, 1]


def test_a_forged_payload_with_a_recomputed_digest_decodes_unkeyed_but_is_refused_keyed(payload):
    forged = forge(payload)
    assert wire.decode(forged, CONFIG).seeds == [7, 1]  # the digest alone lets it through
    with pytest.raises(UnauthenticPayloadError, match="carries no keyed tag") as refused:
        keyed.verify(forged, KEY)
    assert refused.value.status == 403 and refused.value.kind == "unauthentic_payload"


@pytest.mark.parametrize("tamper", ["payload byte", "tag byte", "other key", "tag of the genuine payload"])
def test_a_tag_that_does_not_match_is_refused(payload, tamper):
    tagged = bytearray(keyed.sign(payload, KEY))
    if tamper == "payload byte":
        tagged[-1] ^= 1
    elif tamper == "tag byte":
        tagged[8] ^= 1
    elif tamper == "other key":
        tagged = keyed.sign(payload, KEY[::-1])
    else:
        tagged = tagged[: keyed.TAGGED_PREFIX] + forge(payload)
    with pytest.raises(UnauthenticPayloadError, match="does not match"):
        keyed.verify(tagged, KEY)


def test_a_short_or_bare_magic_is_refused(payload):
    with pytest.raises(UnauthenticPayloadError):
        keyed.verify(keyed.TAG_MAGIC + b"\0" * 10, KEY)


def test_an_edge_without_a_key_drops_tags_unchecked(payload):
    assert bytes(keyed.verify(keyed.sign(payload, KEY), None)) == payload
    assert bytes(keyed.verify(payload, None)) == payload


def test_the_key_file_is_read_stripped_and_must_be_long_enough(tmp_path, monkeypatch):
    path = tmp_path / "key"
    path.write_bytes(KEY + b"\n")
    assert keyed.read_key(path) == KEY
    monkeypatch.setenv(keyed.KEY_FILE_ENV, str(path))
    assert keyed.key_from_environment() == KEY
    path.write_bytes(b"short\n")
    with pytest.raises(BadInputError, match="fewer than 16"):
        keyed.read_key(path)
    with pytest.raises(BadInputError, match="cannot read the wire key file"):
        keyed.read_key(tmp_path / "missing")
    monkeypatch.delenv(keyed.KEY_FILE_ENV)
    assert keyed.key_from_environment() is None


def test_a_key_file_others_may_write_is_refused_and_one_they_may_read_warned_about(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"k" * 32)
    path.chmod(0o622)
    with pytest.raises(BadInputError, match="may be written by other users"):
        keyed.read_key(path)
    path.chmod(0o604)
    with pytest.warns(UserWarning, match="is readable by other users"):
        assert keyed.read_key(path) == b"k" * 32
    path.chmod(0o600)
    assert keyed.read_key(path) == b"k" * 32
