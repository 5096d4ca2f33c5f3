"""Help text that shows what a user types: ``--group GROUP``, ``--max N``, ``TOPIC``, and
nothing after a flag (typer's own help shows Python types: ``<str>``, ``<bool>``,
``<list[str]>``, ``{topic}``), and whose sentences the terminal wraps, not the source.

Typer's rich help keeps a docstring's single line breaks in the list of a group's
commands and in every paragraph after the first, so a docstring wrapped at 90 columns
broke its sentences mid-line on any screen; each paragraph is one line here (a
paragraph that starts with click's ``\b`` is kept as written).
"""

from __future__ import annotations

import inspect

from typer._click.core import Command, Context, Parameter  # typer's own copy of click
from typer.core import TyperArgument, TyperGroup

# Value names by parameter name; others are the name in capitals (``--group GROUP``).
METAVARS = {
    "api_key": "KEY_ID:SECRET", "url": "URL", "data_dir": "DIR", "warehouse": "PATH",
    "config": "NAME=VALUE", "prop": "NAME=VALUE", "delete_config": "NAME",
    "before": "PARTITION=OFFSET", "separator": "SEP", "acks": "all|1|0",
    "max_records": "N", "partitions": "N", "max_rows": "N", "to_offset": "OFFSET",
    "to_datetime": "DATETIME", "auth": "api-key|none", "tls_cert": "PEM", "tls_key": "PEM",
    "log_level": "LEVEL", "query": "SQL", "key_id": "KEY_ID", "brokers": "N",
    "replication_factor": "N", "sql_port": "PORT",
}
SUFFIXES = {"_ms": "MS", "_bytes": "BYTES", "_hours": "HOURS"}


def metavar(name: str) -> str:
    if name in METAVARS:
        return METAVARS[name]
    for suffix, value in SUFFIXES.items():
        if name.endswith(suffix):
            return value
    return name.upper()


class _Argument(TyperArgument):
    """An argument shown as ``TOPIC`` (required) or ``[TOPIC]``, without a type column."""

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")

    def display_type_rich(self, ctx: Context) -> str | None:
        return None


def _show(params: list[Parameter | None]) -> None:
    for param in params:
        if param is None:
            continue
        if getattr(param, "is_flag", False) or getattr(param, "count", False):
            param.metavar = ""  # a flag takes no value: show none
        elif param.metavar is None and param.name:
            param.metavar = metavar(param.name)
        if isinstance(param, TyperArgument) and not isinstance(param, _Argument):
            param.__class__ = _Argument  # same fields; only how it is shown differs


def unwrap(text: str | None) -> str | None:
    """``text`` with each paragraph on one line (paragraphs: split by blank lines)."""
    if not text:
        return text
    paragraphs = inspect.cleandoc(text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(
        line.strip() for line in p.splitlines() if line.strip()) for p in paragraphs)


def show_what_users_type(cmd: Command, ctx: Context) -> None:
    """Set the value names of a command's parameters (and its subcommands'), and unwrap
    its help."""
    cmd.help, cmd.short_help = unwrap(cmd.help), unwrap(cmd.short_help)
    _show([*cmd.params, cmd.get_help_option(ctx)])
    for sub in getattr(cmd, "commands", {}).values():  # typer's groups
        show_what_users_type(sub, ctx)


class LakelogGroup(TyperGroup):
    """The root command: it and every command it hands out show what users type."""

    def get_command(self, ctx: Context, cmd_name: str) -> Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if cmd is not None:
            show_what_users_type(cmd, ctx)
        return cmd

    def get_params(self, ctx: Context) -> list[Parameter]:
        params = super().get_params(ctx)
        _show(list(params))
        return params
