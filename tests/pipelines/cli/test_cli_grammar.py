"""One grammar for every command: global options before or after the command name, ``-h``,
``--version``, help on every command and option, and docs (README.md, docs/) that match the help."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from icelog.pipelines.cli import cli
from tests.support.cli import ROOT, Cli, one_document


def _commands(command: click.Command = cli, path: tuple[str, ...] = ("icelog",)):
    """Every command of the tree, groups included, with its path."""
    yield path, command
    if isinstance(command, click.Group):
        for name, sub in command.commands.items():
            yield from _commands(sub, (*path, name))


LEAVES = [path[1:] for path, command in _commands() if not isinstance(command, click.Group)]


@pytest.fixture
def events(icelog: Cli) -> Cli:
    icelog("topics", "create", "db.events", "--partitions", "2")
    return icelog


@pytest.mark.parametrize(
    "argv",
    [
        ["--output", "json", "topics", "list"],
        ["topics", "list", "--output", "json"],
        ["topics", "list", "--output=json"],
        ["--output", "text", "topics", "list", "--output", "json"],
    ],
)
def test_output_json_before_or_after_the_command_name(events, argv):
    result = events.raw(*argv, json_output=False)
    assert result.exit_code == 0, result.output
    assert one_document(result.stdout) == {"tables": ["db.events"]}


def test_output_given_after_the_command_name_wins(events):
    result = events.raw("--output", "json", "topics", "list", "--output", "text", json_output=False)
    assert result.exit_code == 0 and result.stdout.strip() == "db.events"


def test_catalog_given_after_the_command_name_wins(events, sqlite_spec, tmp_path):
    other = {
        "PYICEBERG_CATALOG__OTHER__URI": f"sqlite:///{tmp_path / 'other.db'}",
        "PYICEBERG_CATALOG__OTHER__WAREHOUSE": (tmp_path / "other").as_uri(),
    }
    (tmp_path / "other").mkdir()
    two = Cli(sqlite_spec, **other)
    assert two("topics", "list", "--catalog", "other") == {"tables": []}
    assert two("--catalog", "other", "topics", "list", "--catalog", sqlite_spec.name) == {"tables": ["db.events"]}
    assert two("--catalog", sqlite_spec.name, "topics", "list") == {"tables": ["db.events"]}


def test_a_usage_error_after_the_command_name_is_json_when_asked_there(events):
    result = events.raw("topics", "create", "db.other", "--partitions", "none", "--output", "json", json_output=False)
    assert result.exit_code == 2
    assert one_document(result.stdout)["param"] == "partitions"


@pytest.mark.parametrize("path", LEAVES, ids=" ".join)
def test_every_command_takes_the_global_options_and_h(path):
    command = cli
    for name in path:
        command = command.commands[name]
    names = {opt for p in command.params for opt in p.opts}
    assert {"--output", "--catalog"} <= names
    result = CliRunner().invoke(cli, [*path, "-h"], prog_name="icelog")
    assert result.exit_code == 0 and result.stdout.startswith(f"Usage: icelog {' '.join(path)}"), result.output


def test_version_is_the_package_version():
    from importlib.metadata import version

    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0 and result.stdout.strip() == f"icelog {version('icelog')}"


def test_every_command_and_option_has_help():
    missing = []
    for path, command in _commands():
        if not (command.help or "").strip():
            missing.append(" ".join(path))
        missing += [
            f"{' '.join(path)} {p.opts[0]}"
            for p in command.params
            if isinstance(p, click.Option) and not p.hidden and not (p.help or "").strip()
        ]
    assert missing == []


def test_validate_check_offers_every_check_the_validator_runs():
    from icelog.validations.checks import CHECKS

    check = next(p for p in cli.commands["validate"].params if p.name == "check_names")
    assert list(check.type.choices) == list(CHECKS)
    shown = CliRunner().invoke(cli, ["validate", "-h"], terminal_width=400).stdout
    assert f"--check [{'|'.join(CHECKS)}]" in shown


def test_validate_check_refuses_an_unknown_check_naming_the_known_ones(events):
    result = events.raw("validate", "db.events", "--check", "nope")
    assert result.exit_code == 2
    doc = one_document(result.stdout)
    assert doc["param"] == "check_names" and "mirror-parity" in doc["message"]
    assert events("validate", "db.events", "--check", "groups", "--check", "transactions")["checks"] == ["groups", "transactions"]


def test_help_imports_nothing_heavy():
    """Start-up: ``icelog --help`` and a command's usage error load no table, query or check modules."""
    code = (
        "import sys\n"
        "from pipelines.cli import cli\n"
        "for argv in (['--help'], ['validate']):\n"
        "    try:\n"
        "        cli(argv, prog_name='icelog')\n"
        "    except SystemExit:\n"
        "        pass\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in ('pyiceberg', 'pyarrow', 'duckdb', 'validations', 'rich')]\n"
        "print(heavy)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"


def test_every_groups_command_names_the_group_with_group_option():
    """kafka-consumer-groups' convention: the group is --group everywhere, the table positional."""
    for path, command in _commands(cli.commands["groups"], ("groups",)):
        if isinstance(command, click.Group) or path[-1] == "list":
            continue
        group = next(p for p in command.params if p.name == "group")
        assert isinstance(group, click.Option) and group.opts == ["--group"], path
    assert "--group" in {opt for p in cli.commands["consume"].params for opt in p.opts}


def test_groups_describe_takes_group_option_and_still_the_old_positional(events):
    events("produce", "db.events", "--partition", "0", input='{"key": "a", "value": "b"}\n')
    events("groups", "commit", "db.events", "--group", "g", "--partition", "0", "--range", "0-0")
    new = events("groups", "describe", "--group", "g")
    assert new["group"] == "g" and [p["stable_offset"] for p in new["partitions"]] == [0]
    old = events.raw("groups", "describe", "g")
    assert old.exit_code == 0 and one_document(old.stdout) == new
    assert "Use --group GROUP" in old.stderr


@pytest.mark.parametrize("args", [[], ["a", "--group", "b"]])
def test_groups_describe_without_one_group_is_a_usage_error_naming_group(events, args):
    result = events.raw("groups", "describe", *args)
    assert result.exit_code == 2
    assert "--group" in one_document(result.stdout)["message"]


# --- the docs match the help --------------------------------------------------------------

DOCS = "\n".join(page.read_text() for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))])
CLI_REFERENCE = (ROOT / "docs" / "cli.md").read_text()
_SHELL_ENDS = {"|", "||", "&&", ";", "<", ">", ">>", "2>&1"}


def _readme_invocations() -> list[str]:
    """Every ``icelog ...`` README.md and docs/ show: lines of their code blocks and their inline code."""
    blocks = re.findall(r"^```[a-z]*\n(.*?)^```", DOCS, flags=re.S | re.M)
    lines = [line for block in blocks for line in block.splitlines()]
    spans = re.findall(r"`(icelog [^`]+)`", DOCS)
    found = []
    for text in [*lines, *spans]:
        tokens = shlex.split(text, comments=True) if "icelog" in text else []
        for i, token in enumerate(tokens):
            if token == "icelog" and (i == 0 or tokens[i - 1] in _SHELL_ENDS or "=" in tokens[i - 1]):
                end = next((j for j in range(i + 1, len(tokens)) if tokens[j] in _SHELL_ENDS), len(tokens))
                found.append(" ".join(shlex.quote(t) for t in tokens[i:end]))
    return found


def _argv(invocation: str) -> list[str]:
    """The words after ``icelog``, with the usage brackets ``[...]`` and ellipses dropped."""
    words = [w.strip("[]") for w in shlex.split(invocation)[1:]]
    return [w for w in words if w and w != "..."]


def _alternatives(argv: list[str], group: click.Group = cli) -> list[list[str]]:
    """``acls add|remove|list`` is three command lines: one per command name."""
    for i, word in enumerate(argv):
        if word.startswith("-") or word not in group.commands and "|" not in word:
            continue
        names = word.split("|")
        if len(names) > 1 and all(n in group.commands for n in names):
            return [alt for n in names for alt in _alternatives([*argv[:i], n, *argv[i + 1 :]], group)]
        sub = group.commands.get(word)
        if isinstance(sub, click.Group):
            return [[*argv[: i + 1], *alt] for alt in _alternatives(argv[i + 1 :], sub)]
        break
    return [argv]


def _parse(argv: list[str]) -> list[str]:
    """Parse ``argv`` with icelog's own Click tree; returns the command path. Placeholder values
    (``TABLE``, ``N``) may fail their types and required options may be missing; an unknown
    command, an unknown option, or an option without its value fails."""
    try:
        ctx = cli.make_context("icelog", list(argv))
    except click.exceptions.Exit:  # --version, -h
        return []
    command: click.Command = cli
    path = []
    while isinstance(command, click.Group):
        # Click keeps the subcommand's name in _protected_args (its public alias warns)
        name, sub, rest = command.resolve_command(ctx, [*ctx._protected_args, *ctx.args])
        path.append(name)
        command = sub
        try:
            ctx = sub.make_context(name, rest, parent=ctx)
        except click.BadParameter:  # a placeholder value, or a required option left out
            break
        except click.exceptions.Exit:  # -h
            break
    return path


INVOCATIONS = _readme_invocations()


def test_the_readme_shows_icelog_command_lines():
    assert len(INVOCATIONS) > 40
    assert "icelog groups describe --group G" in INVOCATIONS


@pytest.mark.parametrize("invocation", INVOCATIONS)
def test_every_command_line_in_the_readme_parses(invocation):
    for argv in _alternatives(_argv(invocation)):
        try:
            _parse(argv)
        except click.UsageError as e:
            pytest.fail(f"README.md or docs/: {invocation!r}: {e.format_message()}")


def test_the_readme_shows_every_command():
    shown = {tuple(_parse(argv)) for invocation in INVOCATIONS for argv in _alternatives(_argv(invocation))}
    missing = [" ".join(path) for path in LEAVES if path not in shown and not (path[-1] == "run" and path[:-1] in shown)]
    assert missing == []


def test_the_cli_reference_shows_every_command_and_option():
    """docs/cli.md alone covers the whole CLI: a new command or option is documented there."""
    invocations = [
        " ".join(shlex.quote(t) for t in shlex.split(line, comments=True))
        for block in re.findall(r"^```[a-z]*\n(.*?)^```", CLI_REFERENCE, flags=re.S | re.M)
        for line in block.splitlines()
        if line.startswith("icelog ")
    ]
    shown = {tuple(_parse(argv)) for invocation in invocations for argv in _alternatives(_argv(invocation))}
    missing = [" ".join(path) for path in LEAVES if path not in shown and not (path[-1] == "run" and path[:-1] in shown)]
    assert missing == []
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", CLI_REFERENCE))
    options = {opt for _, command in _commands() for p in command.params for opt in p.opts + p.secondary_opts}
    assert sorted(o for o in options - named if o.startswith("--") and o != "--consistent") == []


def test_every_option_the_cli_reference_names_exists():
    named = set(re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", CLI_REFERENCE))
    known = {opt for _, command in _commands() for p in command.params for opt in p.opts + p.secondary_opts}
    known |= set(cli.context_settings["help_option_names"])
    assert sorted(named - known) == []
