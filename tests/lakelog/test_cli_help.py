"""Every ``--help`` page: the terminal wraps the help's sentences, the source does not
(a docstring's line breaks once cut sentences mid-line in the list of commands and in
every paragraph after the first)."""

from __future__ import annotations

import re

import typer
from typer._click.core import Command, Context
from typer.testing import CliRunner

from lakelog.cli import app
from lakelog.cli.help import unwrap

WIDE = "1000"
"""Columns: wider than any help paragraph, so any line break in one is the text's own."""
BOX = re.compile(r"[│╭╮╰╯─]")


def _commands() -> list[tuple[list[str], Command]]:
    """(path, command) of the root and every command and group below it."""
    root = typer.main.get_command(app)
    found: list[tuple[list[str], Command]] = []

    def walk(path: list[str], cmd: Command) -> None:
        found.append((path, cmd))
        ctx = Context(cmd, info_name=path[-1] if path else "lakelog")
        for name in getattr(cmd, "list_commands", lambda _: [])(ctx):
            sub = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
            if sub is not None and not sub.hidden:
                walk([*path, name], sub)

    walk([], root)
    return found


def _paragraphs(text: str | None) -> list[str]:
    return [" ".join(p.split()) for p in (unwrap(text) or "").split("\n\n") if p.strip()]


def test_no_help_paragraph_is_broken_across_lines() -> None:
    runner = CliRunner()
    commands = _commands()
    assert len(commands) > 30
    for path, cmd in commands:
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": WIDE,
                                                         "TERMINAL_WIDTH": WIDE})
        assert out.exit_code == 0, (path, out.output)
        lines = [" ".join(BOX.sub(" ", line).split()) for line in out.output.splitlines()]
        wanted = _paragraphs(cmd.help)
        ctx = Context(cmd, info_name="x")
        for name in getattr(cmd, "list_commands", lambda _: [])(ctx):
            sub = cmd.get_command(ctx, name)  # type: ignore[attr-defined]
            if sub is not None and not sub.hidden:  # its row in the list of commands
                wanted.append(f"{name} {_paragraphs(sub.short_help or sub.help)[0]}")
        for paragraph in wanted:
            assert any(paragraph in line for line in lines), (path, paragraph, out.output)
