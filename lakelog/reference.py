"""The configuration reference (``docs/operations.md``), generated from the code so it cannot drift.

The settings come from :class:`lakelog.settings.Settings`, which composes the packages'
own (each field's default and description, grouped by owner), the topic configs from
:data:`log_tables.config.CONFIG_DEFS`. ``python -m lakelog.reference`` rewrites the
tables between the ``<!-- BEGIN generated: NAME -->`` and ``<!-- END generated: NAME -->``
markers of ``docs/operations.md`` (it was the README's until the reference moved to
the documentation site); ``--check`` only says whether they are current (exit 1 if not),
and the test suite runs the same check.
"""

from __future__ import annotations

import sys
from pathlib import Path

from lakelog.settings import Settings
from log_tables.config import CONFIG_DEFS

PAGE = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
README = PAGE  # its name when the reference was in the README

_UNITS_MS = ((24 * 3600 * 1000, "day"), (3600 * 1000, "h"), (60 * 1000, "min"), (1000, "s"))
_UNITS_BYTES = ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))


def _human(name: str, value: object) -> str:
    """``value`` as code, with a readable size or duration when the name says its unit."""
    if value is None:
        return "unset"
    if isinstance(value, bool):  # as Kafka and the environment write them
        return f"`{str(value).lower()}`"
    text = f"`{value}`"
    if not isinstance(value, int) or value <= 0:
        return text
    if name.endswith(("_ms", ".ms")):
        if value == (1 << 63) - 1:
            return f"{text} (no limit)"
        for size, unit in _UNITS_MS:
            if value % size == 0:
                n = value // size
                plural = "s" if unit == "day" and n != 1 else ""
                return f"{text} ({n} {unit}{plural})"
    if name.endswith(("_bytes", ".bytes")):
        for size, unit in _UNITS_BYTES:
            if value % size == 0:
                return f"{text} ({value // size} {unit})"
    return text


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def settings_table() -> str:
    rows = ["| environment variable | default | meaning |", "|---|---|---|"]
    for name in Settings.names():
        field = Settings.model_fields[name]
        rows.append(f"| `LAKELOG_{name.upper()}` | {_human(name, field.default)} | "
                    f"{_cell(field.description or '')} |")
    return "\n".join(rows)


def topic_configs_table() -> str:
    rows = ["| config | default | meaning |", "|---|---|---|"]
    for d in CONFIG_DEFS:
        rows.append(f"| `{d.name}` | {_human(d.name, d.default)} | {_cell(d.doc)} |")
    return "\n".join(rows)


TABLES = {"settings": settings_table, "topic-configs": topic_configs_table}


def render(text: str) -> str:
    """``text`` with every generated block replaced by the current table."""
    for name, table in TABLES.items():
        begin, end = f"<!-- BEGIN generated: {name} -->\n", f"\n<!-- END generated: {name} -->"
        start, stop = text.find(begin), text.find(end)
        if start < 0 or stop < start:
            raise ValueError(f"{PAGE.name} has no {begin.strip()} ... {end.strip()} block")
        text = text[:start + len(begin)] + table() + text[stop:]
    return text


def main(argv: list[str]) -> int:
    current = README.read_text()
    fresh = render(current)
    if "--check" in argv:
        if fresh != current:
            print("docs/operations.md's configuration reference is stale: run "
                  "`python -m lakelog.reference`", file=sys.stderr)
            return 1
        return 0
    if fresh != current:
        README.write_text(fresh)
        print("docs/operations.md: configuration reference updated")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
