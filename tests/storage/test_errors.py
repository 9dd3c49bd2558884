"""The declared error classes: keyword-only typed fields, a rendered message, fixed fields, pickling."""

from __future__ import annotations

import inspect
import pickle

import pytest

from icelog.storage import errors
from icelog.storage.errors import EmptyBatch, IcelogError, InvalidInput, MalformedInput, SchemaMismatch, UnknownTable


def _declared() -> list[type[IcelogError]]:
    found, todo = [], [IcelogError]
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo.extend(cls.__subclasses__())
    return sorted({c for c in found if c.__module__ == errors.__name__}, key=lambda c: c.__name__)


def _sample(param: inspect.Parameter):
    kind = str(param.annotation)
    if kind.startswith("list"):
        return {"list[int]": [1, 2], "list[str]": ["a"]}.get(kind, [])
    return 7 if "int" in kind else f"{param.name}-v"


@pytest.mark.parametrize("cls", _declared(), ids=lambda c: c.__name__)
def test_every_error_takes_keyword_only_fields_and_pickles_by_them(cls):
    params = inspect.signature(cls).parameters.values()
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params)
    error = cls(**{p.name: _sample(p) for p in params})
    assert list(error.fields) == [p.name for p in params]
    assert error.args == (str(error),) and str(error) == error.describe()
    clone = pickle.loads(pickle.dumps(error))
    assert type(clone) is cls and clone.to_dict() == error.to_dict() and clone.args == error.args


def test_a_template_renders_the_fields_own_fields_first():
    error = SchemaMismatch(table="db.t", reason="no column x")
    assert str(error) == "rows do not match the payload schema of db.t: no column x"
    assert error.to_dict() == {"error": "SchemaMismatch", "message": str(error), "table": "db.t", "reason": "no column x"}
    assert list(error.to_dict()) == ["error", "message", "table", "reason"]
    assert isinstance(error, InvalidInput) and isinstance(error, ValueError)


def test_a_fixed_field_is_neither_a_parameter_nor_in_fields():
    error = EmptyBatch(table="db.t", partition=2)
    assert error.reason == "empty batch" and list(error.fields) == ["table", "partition"]
    with pytest.raises(TypeError):
        EmptyBatch(table="db.t", partition=2, reason="other")  # type: ignore[call-arg]


def test_defaults_and_missing_fields():
    assert UnknownTable(table="db.t").catalog is None
    assert str(MalformedInput(reason="bad")) == "malformed input: bad"
    assert str(MalformedInput(reason="bad", line=3)) == "malformed input at line 3: bad"
    with pytest.raises(TypeError, match=r"UnknownTable.__init__\(\) missing 1 required keyword-only argument: 'table'"):
        UnknownTable()  # type: ignore[call-arg]
    with pytest.raises(TypeError):
        UnknownTable("db.t")  # type: ignore[misc]


def test_a_subclass_with_a_hand_written_init_keeps_its_fields():
    class Legacy(errors.TerminalError):
        def __init__(self, *, table: str) -> None:
            self.table = table
            super().__init__()

        def describe(self) -> str:
            return f"{self.table}: legacy"

    error = Legacy(table="db.t")
    assert error.to_dict() == {"error": "Legacy", "message": "db.t: legacy", "table": "db.t"}
