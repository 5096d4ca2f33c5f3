"""The configuration reference (docs/operations.md) is generated from the code and must be current."""

from __future__ import annotations

from lakelog import reference
from lakelog.settings import Settings
from log_tables.config import CONFIG_DEFS


def test_readme_configuration_reference_is_current() -> None:
    text = reference.README.read_text()
    assert reference.render(text) == text, "run `python -m lakelog.reference` to refresh it"
    for name in Settings.model_fields:
        assert f"| `LAKELOG_{name.upper()}` |" in text
    for d in CONFIG_DEFS:
        assert f"| `{d.name}` |" in text


def test_render_replaces_a_stale_table_and_names_a_missing_block() -> None:
    stale = ("x\n<!-- BEGIN generated: settings -->\n| old |\n<!-- END generated: settings -->\n"
             "<!-- BEGIN generated: topic-configs -->\n<!-- END generated: topic-configs -->\n")
    fresh = reference.render(stale)
    assert "| old |" not in fresh and "`LAKELOG_PORT` | `8080` |" in fresh
    assert "`retention.ms` | `604800000` (7 days) |" in fresh
    assert reference.render(fresh) == fresh
    try:
        reference.render("no markers")
    except ValueError as exc:
        assert "BEGIN generated: settings" in str(exc)
    else:
        raise AssertionError("a README without the block must be an error")
