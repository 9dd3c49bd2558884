"""SASL for the gateway: PLAIN and SCRAM-SHA-256/512 (RFC 5802, as Kafka speaks them) against a users file.

The users file holds ``user:password`` lines. At load each password becomes SCRAM credentials
(a random salt, PBKDF2 iterations, StoredKey and ServerKey per hash) and the password itself is
dropped: PLAIN is checked by deriving SCRAM-SHA-256's StoredKey from the password sent. Every
comparison is constant-time (``hmac.compare_digest``). An unknown user goes through the same
steps against a stand-in credential, so neither the answers nor their timing tell which names exist.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path

from icelog.storage.errors import SaslUsersFile

PLAIN = "PLAIN"
SCRAM_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MECHANISMS = (PLAIN, *SCRAM_HASHES)
ITERATIONS = 4096  # Kafka's minimum for SCRAM-SHA-256 and -512
MAX_UNAUTHENTICATED_BYTES = 512 * 1024  # Kafka's sasl.server.max.receive.size


class AuthenticationFailed(Exception):
    """A SASL step the client failed (a wrong password, a malformed token): the connection ends."""


@dataclass(frozen=True)
class ScramCredential:
    salt: bytes
    iterations: int
    stored_key: bytes
    server_key: bytes


def scram_credential(password: str, hash_name: str, salt: bytes | None = None, iterations: int = ITERATIONS) -> ScramCredential:
    salt = salt if salt is not None else secrets.token_bytes(24)
    salted = hashlib.pbkdf2_hmac(hash_name, password.encode(), salt, iterations)
    client_key = hmac.digest(salted, b"Client Key", hash_name)
    return ScramCredential(
        salt, iterations, hashlib.new(hash_name, client_key).digest(), hmac.digest(salted, b"Server Key", hash_name)
    )


class Users:
    """The credentials of the users allowed in; no password is kept."""

    def __init__(self, passwords: dict[str, str]) -> None:
        self.credentials = {
            user: {mech: scram_credential(password, h) for mech, h in SCRAM_HASHES.items()}
            for user, password in passwords.items()
        }
        self._secret = secrets.token_bytes(32)
        self._stand_in = {mech: scram_credential(secrets.token_hex(16), h) for mech, h in SCRAM_HASHES.items()}

    def __len__(self) -> int:
        return len(self.credentials)

    def credential(self, user: str, mechanism: str) -> tuple[ScramCredential, bool]:
        """(the credential, whether the user exists): an unknown user gets a stand-in with a
        salt stable per name, so asking twice does not reveal that the name is unknown."""
        known = self.credentials.get(user)
        if known is not None:
            return known[mechanism], True
        stand_in = self._stand_in[mechanism]
        salt = hmac.digest(self._secret, user.encode(), "sha256")[:24]
        return ScramCredential(salt, stand_in.iterations, stand_in.stored_key, stand_in.server_key), False

    def check_password(self, user: str, password: str) -> bool:
        credential, known = self.credential(user, "SCRAM-SHA-256")
        derived = scram_credential(password, "sha256", credential.salt, credential.iterations)
        return hmac.compare_digest(derived.stored_key, credential.stored_key) and known


def load_users(path: str | Path) -> Users:
    """The users of a ``user:password`` file (``#`` comments and blank lines skipped).

    Raises:
        SaslUsersFile: the file is missing, readable or writable by group or others, or a line
            is not ``user:password`` with both parts non-empty (the line number is named, not its text).
    """
    path = Path(path)
    try:
        mode = path.stat().st_mode
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SaslUsersFile(path=str(path), reason=f"cannot read it ({type(e).__name__})") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise SaslUsersFile(path=str(path), reason=f"group or others may access it (mode {stat.S_IMODE(mode):o}); chmod 600 it")
    passwords: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        user, sep, password = line.partition(":")
        if not sep or not user or not password or user != user.strip():
            raise SaslUsersFile(path=str(path), reason=f"line {number} is not user:password")
        if user in passwords:
            raise SaslUsersFile(path=str(path), reason=f"line {number} repeats a user")
        passwords[user] = password
    if not passwords:
        raise SaslUsersFile(path=str(path), reason="it names no user")
    return Users(passwords)


class Exchange:
    """One client's authentication by one mechanism: ``step`` takes each client token and
    returns the server's; ``done`` once the client is in.

    Raises (from ``step``):
        AuthenticationFailed: a wrong password, an unknown user, a malformed token, a step too many.
    """

    def __init__(self, users: Users, mechanism: str) -> None:
        self.users = users
        self.mechanism = mechanism
        self.user: str | None = None
        self.done = False
        self._scram: tuple | None = None  # (credential, known, client-first-bare, server-first, gs2 header, nonce)

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise AuthenticationFailed("authentication already completed")
        try:
            text = token.decode("utf-8")
            if self.mechanism == PLAIN:
                return self._plain(text)
            if self._scram is None:
                return self._client_first(text)
            return self._client_final(text)
        except (ValueError, binascii.Error) as e:  # UnicodeDecodeError is a ValueError
            raise AuthenticationFailed("malformed SASL token") from e

    def _plain(self, text: str) -> bytes:
        authzid, user, password = text.split("\0")  # a ValueError unless exactly three parts
        if authzid not in ("", user):
            raise AuthenticationFailed("an authorization id other than the user")
        if not self.users.check_password(user, password):
            raise AuthenticationFailed("invalid username or password")
        self.user, self.done = user, True
        return b""

    def _client_first(self, text: str) -> bytes:
        flag, authzid, bare = text.split(",", 2)
        if flag not in ("n", "y"):
            raise AuthenticationFailed("channel binding is not served")
        attributes = bare.split(",")
        if len(attributes) < 2 or not attributes[0].startswith("n=") or not attributes[1].startswith("r="):
            raise ValueError("client-first message")
        user = _saslname(attributes[0][2:])
        client_nonce = attributes[1][2:]
        if not client_nonce or authzid not in ("", f"a={attributes[0][2:]}"):
            raise ValueError("client-first message")
        credential, known = self.users.credential(user, self.mechanism)
        nonce = client_nonce + secrets.token_urlsafe(24)
        server_first = f"r={nonce},s={base64.b64encode(credential.salt).decode()},i={credential.iterations}"
        self.user = user
        self._scram = (credential, known, bare, server_first, f"{flag},{authzid},", nonce)
        return server_first.encode()

    def _client_final(self, text: str) -> bytes:
        credential, known, client_first, server_first, gs2_header, nonce = self._scram
        without_proof, sep, proof_text = text.rpartition(",p=")
        attributes = without_proof.split(",")
        if not sep or len(attributes) < 2:
            raise ValueError("client-final message")
        binding = base64.b64decode(attributes[0].removeprefix("c="), validate=True)
        if not attributes[0].startswith("c=") or binding != gs2_header.encode():
            raise AuthenticationFailed("channel binding does not match")
        if not hmac.compare_digest(attributes[1].encode(), f"r={nonce}".encode()):
            raise AuthenticationFailed("nonce does not match")
        hash_name = SCRAM_HASHES[self.mechanism]
        proof = base64.b64decode(proof_text, validate=True)
        auth_message = f"{client_first},{server_first},{without_proof}".encode()
        signature = hmac.digest(credential.stored_key, auth_message, hash_name)
        if len(proof) != len(signature):
            raise AuthenticationFailed("invalid username or password")
        client_key = bytes(a ^ b for a, b in zip(proof, signature, strict=True))
        stored_key = hashlib.new(hash_name, client_key).digest()
        if not (hmac.compare_digest(stored_key, credential.stored_key) and known):
            raise AuthenticationFailed("invalid username or password")
        self.done = True
        server_signature = hmac.digest(credential.server_key, auth_message, hash_name)
        return b"v=" + base64.b64encode(server_signature)


def _saslname(name: str) -> str:
    """RFC 5802's saslname: ``=2C`` is a comma, ``=3D`` an equals sign, any other ``=`` malformed."""
    out = name.replace("=2C", ",").replace("=3D", "\0")
    if "=" in out or not out or "\0" in name:
        raise ValueError("saslname")
    return out.replace("\0", "=")
