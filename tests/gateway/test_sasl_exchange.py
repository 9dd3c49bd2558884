"""SASL exchanges as units: PLAIN and SCRAM against known passwords, and tokens that are not."""

from __future__ import annotations

import base64
import hashlib
import hmac

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from icelog.pipelines.gateway.sasl import AuthenticationFailed, Exchange, Users

USERS = Users({"user": "pencil", "other": "secret"})


def test_no_password_is_kept():
    assert "pencil" not in repr(vars(USERS)) and b"pencil" not in repr(vars(USERS)).encode()


def test_plain_accepts_the_password_and_nothing_else():
    assert Exchange(USERS, "PLAIN").step(b"\0user\0pencil") == b""
    assert Exchange(USERS, "PLAIN").step(b"user\0user\0pencil") == b""
    for token in (b"\0user\0Pencil", b"\0other\0pencil", b"\0nobody\0pencil", b"other\0user\0pencil", b"\0user\0pencil\0"):
        with pytest.raises(AuthenticationFailed):
            Exchange(USERS, "PLAIN").step(token)


def _client_final(
    password: str, server_first: bytes, client_first_bare: str, hash_name: str, proof_flip: bool = False
) -> tuple[bytes, bytes]:
    """RFC 5802's client side: the client-final message and the server signature to expect."""
    attributes = dict(a.split("=", 1) for a in server_first.decode().split(","))
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"]))
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    without_proof = f"c=biws,r={attributes['r']}"
    auth_message = f"{client_first_bare},{server_first.decode()},{without_proof}".encode()
    signature = hmac.digest(hashlib.new(hash_name, client_key).digest(), auth_message, hash_name)
    proof = bytes(a ^ b for a, b in zip(client_key, signature, strict=True))
    if proof_flip:
        proof = bytes([proof[0] ^ 1]) + proof[1:]
    server_signature = hmac.digest(hmac.digest(salted, b"Server Key", hash_name), auth_message, hash_name)
    return f"{without_proof},p={base64.b64encode(proof).decode()}".encode(), b"v=" + base64.b64encode(server_signature)


@pytest.mark.parametrize(("mechanism", "hash_name"), [("SCRAM-SHA-256", "sha256"), ("SCRAM-SHA-512", "sha512")])
@pytest.mark.parametrize(
    ("user", "password", "ok"), [("user", "pencil", True), ("user", "Pencil", False), ("nobody", "pencil", False)]
)
def test_scram_proves_the_password_both_ways(mechanism, hash_name, user, password, ok):
    exchange = Exchange(USERS, mechanism)
    bare = f"n={user},r=rOprNGfwEbeRWgbNEkqO"
    server_first = exchange.step(f"n,,{bare}".encode())
    assert server_first.startswith(b"r=rOprNGfwEbeRWgbNEkqO") and b",i=4096" in server_first
    final, expected = _client_final(password, server_first, bare, hash_name)
    if ok:
        assert exchange.step(final) == expected and exchange.done
    else:
        with pytest.raises(AuthenticationFailed):
            exchange.step(final)
        assert not exchange.done


def test_an_unknown_user_gets_the_same_salt_each_time():
    first = [Exchange(USERS, "SCRAM-SHA-256").step(b"n,,n=nobody,r=abc").split(b",")[1] for _ in range(2)]
    assert first[0] == first[1]


@pytest.mark.parametrize(("old", "new"), [(b"c=biws", b"c=eSws"), (b",r=abc", b",r=abd")], ids=["binding", "nonce"])
def test_a_scram_nonce_or_binding_not_the_exchanges_is_refused(old, new):
    exchange = Exchange(USERS, "SCRAM-SHA-256")
    final, _ = _client_final("pencil", exchange.step(b"n,,n=user,r=abc"), "n=user,r=abc", "sha256")
    with pytest.raises(AuthenticationFailed):
        exchange.step(final.replace(old, new))


@settings(max_examples=300, deadline=None)
@given(
    mechanism=st.sampled_from(["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]),
    tokens=st.lists(st.binary(max_size=80), min_size=1, max_size=3),
)
def test_any_token_either_fails_cleanly_or_is_answered(mechanism, tokens):
    exchange = Exchange(USERS, mechanism)
    for token in tokens:
        try:
            exchange.step(token)
        except AuthenticationFailed:
            return
    assert not exchange.done
