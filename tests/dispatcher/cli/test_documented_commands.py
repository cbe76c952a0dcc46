"""Every ``usp-webhooks …`` command line in README.md and docs/ names a command that exists, with
options it has (a renamed command or a dropped flag fails here, not in a reader's terminal), and
every command's ``--help`` reads like gh's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from usp_dispatcher import cli
from usp_schemas import EVENT_TYPES

REPO = Path(__file__).resolve().parents[3]
DOCUMENTS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
#: ``usp-webhooks`` then what follows on that line, up to the end of a code span or a comment.
_COMMAND = re.compile(r"usp-webhooks ((?:[^`#|\n])+)")
_WORD = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Documented:
    where: str  #: file:line
    words: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.where}: usp-webhooks {' '.join(self.words)}"


def documented_commands() -> list[Documented]:
    found = []
    for path in DOCUMENTS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _COMMAND.finditer(line):
                words = tuple(match.group(1).split())
                # Only spans in backticks and code blocks are command lines; a settings table's
                # default ("usp-webhooks demo publisher") is a value.
                if words and _in_code(line, match.start()) and not line.startswith("| `USP_"):
                    found.append(Documented(f"{path.relative_to(REPO)}:{number}", words))
    return found


def _in_code(line: str, at: int) -> bool:
    before = line[:at]
    if before.count("`") % 2 == 1:
        return True
    return not line.lstrip().startswith("|") and "`" not in line


def resolve(words: tuple[str, ...]) -> tuple[list[str], Any, list[str]]:
    """The command path the words name, its command, and the options they pass it."""
    command: Any = typer.main.get_command(cli.app)
    path: list[str] = []
    rest = list(words)
    while is_group(command) and rest and _WORD.fullmatch(rest[0]):
        sub = command.get_command(None, rest[0])
        if sub is None:
            break
        path.append(rest.pop(0))
        command = sub
    options = [word.split("=")[0] for word in rest if word.startswith("--")]
    return path, command, options


def is_group(command: Any) -> bool:
    # Typer ships its own copy of Click: duck-typed, not isinstance(click.Group).
    return hasattr(command, "list_commands")


COMMANDS = documented_commands()


def test_the_documents_name_commands() -> None:
    assert len(COMMANDS) > 40, "the README and docs/ are full of them"


@pytest.mark.parametrize("documented", COMMANDS, ids=str)
def test_each_documented_command_exists_and_takes_its_options(documented: Documented) -> None:
    path, command, options = resolve(documented.words)
    assert path, f"{documented}: no such command"
    if is_group(command):  # named alone ("`usp-webhooks api-keys` manages keys") it is fine
        assert len(path) == len(documented.words), f"{documented}: {' '.join(path)} has no such subcommand"
    known = {name for param in command.params for name in getattr(param, "opts", [])}
    known |= {name for param in command.params for name in getattr(param, "secondary_opts", [])}
    for option in options:
        if option.startswith("--") and "[" not in option:
            assert option.rstrip(".,;:)") in known, f"{documented}: {' '.join(path)} has no {option}"
    shown = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "100"})
    assert shown.exit_code == 0, f"{documented}: {shown.output}"


def every_command() -> list[list[str]]:
    found: list[list[str]] = []

    def walk(command: Any, path: list[str]) -> None:
        if is_group(command):
            for name in command.list_commands(None):
                walk(command.get_command(None, name), [*path, name])
        else:
            found.append(path)

    walk(typer.main.get_command(cli.app), [])
    return found


@pytest.mark.parametrize("path", every_command(), ids=" ".join)
def test_help_names_values_not_python_types(path: list[str]) -> None:
    """As gh's and the Stripe CLI's: ``--url URL``, a flag bare; never ``<str>`` or ``<bool>``."""
    shown = CliRunner().invoke(cli.app, [*path, "--help"], env={"COLUMNS": "120"})
    assert shown.exit_code == 0, shown.output
    assert "Options:" in shown.output, shown.output
    for label in ("<str>", "<bool>", "<int", "<list", "<path>", "<float>", "<file>"):
        assert label not in shown.output, f"{' '.join(path)}: {label} in\n{shown.output}"


def test_help_reflows_a_docstring_s_paragraphs_to_the_terminal() -> None:
    """The docstring is wrapped at 100 columns in the source; the help is wrapped at the terminal
    (up to 120), not where the source's lines end."""
    # In a process of its own: Click's test runner forces 80 columns.
    env = os.environ | {"COLUMNS": "120"}
    command = [sys.executable, "-m", "usp_dispatcher.cli", "listen", "--help"]
    shown = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout
    assert "(Ctrl-C, SIGTERM, a closed terminal) and is leased for 60 s" in shown, shown


def test_trigger_s_help_lists_every_event_type() -> None:
    shown = CliRunner().invoke(cli.app, ["trigger", "--help"], env={"COLUMNS": "120"}).output
    for event_type in EVENT_TYPES:
        family, _, name = event_type.rpartition(".")
        line = next(line for line in shown.splitlines() if line.strip().startswith(family + ". "))
        assert name in re.split(r"[,\s]+", line), (event_type, shown)
