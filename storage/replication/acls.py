"""Permissions (KIP-391's ``ReplicatorWrite`` ACL), kept durably in the catalog.

The system table ``icelog_system.acls`` holds, in its properties, a list of grants::

    [{"principal": "mirror-bot", "operation": "replicator-write", "table": "logs.*"}, ...]

``table`` is an fnmatch pattern over qualified table names. The default is deny: an
operation is allowed only if a grant matches the principal, the operation and the table.
Grants change through the commit core, like every other state.

This guards against mistakes by well-meaning clients (an ordinary producer that writes
offsets, a mirror pointed at the wrong table). It is not a security boundary against anyone
who can write the catalog database or the warehouse directly: they can change these grants,
or the tables, without icelog.
"""

from __future__ import annotations

import fnmatch
import json
from dataclasses import dataclass, replace
from typing import Any

from pyiceberg.catalog import Catalog
from pyiceberg.exceptions import NoSuchTableError
from pyiceberg.table import Table
from pyiceberg.table.metadata import TableMetadata

from icelog.storage.core.commit import Decision, Request, commit
from icelog.storage.core.system import ensure_system_table
from icelog.storage.errors import AuthorizationFailed, InvalidInput
from icelog.storage.properties import ACLS
from icelog.storage.settings import PRINCIPAL, Settings

ACLS_TABLE = "icelog_system.acls"
PRINCIPAL_ENV = PRINCIPAL.name
REPLICATOR_WRITE = "replicator-write"
OPERATIONS = (REPLICATOR_WRITE,)


@dataclass(frozen=True)
class Acl:
    """One grant: ``principal`` may do ``operation`` on tables matching ``table``."""

    principal: str
    operation: str
    table: str

    def __post_init__(self) -> None:
        for name in ("principal", "table"):
            value = getattr(self, name)
            if not isinstance(value, str) or not value.strip() or len(value) > 256:
                raise InvalidInput(reason=f"an ACL {name} is a non-empty string of at most 256 characters, not {value!r}")
        if self.operation not in OPERATIONS:
            raise InvalidInput(reason=f"unknown operation {self.operation!r}; known: {list(OPERATIONS)}")

    def allows(self, principal: str, operation: str, table: str) -> bool:
        return self.principal == principal and self.operation == operation and fnmatch.fnmatchcase(table, self.table)

    def to_dict(self) -> dict[str, str]:
        return {"principal": self.principal, "operation": self.operation, "table": self.table}


@dataclass(frozen=True)
class AclState:
    acls: tuple[Acl, ...] = ()
    snapshot_id: int | None = None

    @classmethod
    def from_metadata(cls, metadata: TableMetadata) -> AclState:
        raw = json.loads(metadata.properties.get(ACLS, "[]"))
        return cls(tuple(Acl(**a) for a in raw), metadata.current_snapshot_id)

    def to_properties(self) -> dict[str, str]:
        return {ACLS: json.dumps([a.to_dict() for a in self.acls], sort_keys=True, separators=(",", ":"))}


@dataclass
class ChangeAcl(Request):
    """Add (``grant=True``) or remove one ACL; idempotent."""

    acl: Acl
    grant: bool
    state_type = AclState
    writes_system = True

    def decide(self, state: AclState, table: Table) -> Decision:
        present = self.acl in state.acls
        if self.grant:
            acls = state.acls if present else (*state.acls, self.acl)
        else:
            acls = tuple(a for a in state.acls if a != self.acl)
        result = {"acl": self.acl.to_dict(), "changed": present != self.grant}
        return Decision(state=replace(state, acls=acls), result=result, write=present != self.grant)

    def receipt(self, result: Any) -> Any:
        return result


def current_principal(explicit: str | None = None) -> str | None:
    """The calling principal: the explicit one, else ``ICELOG_PRINCIPAL`` (loaded now), else none."""
    return explicit or Settings.load().principal or None


def add_acl(catalog: Catalog, principal: str, table: str, operation: str = REPLICATOR_WRITE) -> dict[str, Any]:
    """Grant ``operation`` on tables matching ``table`` (an fnmatch pattern) to ``principal``."""
    acl = Acl(principal, operation, table)
    ensure_system_table(catalog, ACLS_TABLE)
    return commit(catalog, ACLS_TABLE, ChangeAcl(acl, True)).result


def remove_acl(catalog: Catalog, principal: str, table: str, operation: str = REPLICATOR_WRITE) -> dict[str, Any]:
    """Revoke exactly one grant (the same principal, operation and pattern)."""
    acl = Acl(principal, operation, table)
    ensure_system_table(catalog, ACLS_TABLE)
    return commit(catalog, ACLS_TABLE, ChangeAcl(acl, False)).result


def list_acls(catalog: Catalog) -> list[Acl]:
    try:
        metadata = catalog.load_table(ACLS_TABLE).metadata
    except NoSuchTableError:
        return []
    return list(AclState.from_metadata(metadata).acls)


def is_allowed(catalog: Catalog, principal: str | None, operation: str, table: str) -> bool:
    if not principal:
        return False
    return any(acl.allows(principal, operation, table) for acl in list_acls(catalog))


def authorize(catalog: Catalog, principal: str | None, operation: str, table: str) -> str:
    """Return the principal if it may do ``operation`` on ``table``, else raise.

    Raises:
        AuthorizationFailed: no grant matches (default deny), or no principal was given.
    """
    principal = current_principal(principal)
    if not is_allowed(catalog, principal, operation, table):
        raise AuthorizationFailed(principal=principal or "<none: set ICELOG_PRINCIPAL>", operation=operation, table=table)
    return principal  # type: ignore[return-value]
