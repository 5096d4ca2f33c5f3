"""``lakelog groups``: consumer groups, as kafka-consumer-groups."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from lakelog.cli.root import DEFAULT_URL, Url, admin, app
from log_tables.errors import LakelogError

groups_app = typer.Typer(help="Consumer groups (like kafka-consumer-groups): list, describe "
                              "with lag, reset offsets, delete.", no_args_is_help=True)
app.add_typer(groups_app, name="groups")


@groups_app.command("list")
def groups_list(url: Url = DEFAULT_URL) -> None:
    """Every group with members or committed offsets."""
    with admin(url) as client:
        groups = client.list_groups()
    for g in groups:
        typer.echo(f"{g['consumer_group_id']}\t{g['state']}\tmembers={g['members']}")


@groups_app.command("describe")
def groups_describe(group: Annotated[str, typer.Argument(help="The group.")],
                    url: Url = DEFAULT_URL) -> None:
    """Members and every partition the group reads (its members' subscriptions and its
    committed topics): committed offset (- where none), log end offset and lag (from the
    log start where nothing is committed), as kafka-consumer-groups --describe."""
    with admin(url) as client:
        d = client.describe_group(group)
    typer.echo(f"group {group}: {d['state']}, {len(d['members'])} member(s), "
               f"assignor {d['assignor'] or '-'}, epoch {d['group_epoch']}")
    header = ("GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG",
              "CONSUMER-ID")
    rows = [header] + [tuple("-" if v is None else str(v) for v in (
        group, o["topic_name"], o["partition_id"], o["committed_offset"], o["log_end_offset"],
        o["lag"], o["member_id"])) for o in d["offsets"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for r in rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())


@groups_app.command("reset-offsets")
def groups_reset(
    group: Annotated[str, typer.Argument(help="The group (it must have no members).")],
    to_earliest: Annotated[bool, typer.Option("--to-earliest")] = False,
    to_latest: Annotated[bool, typer.Option("--to-latest")] = False,
    to_offset: Annotated[int | None, typer.Option("--to-offset")] = None,
    to_datetime: Annotated[str | None, typer.Option(
        "--to-datetime", help="ISO 8601 with a timezone, e.g. 2026-11-21T10:00:00Z")] = None,
    topic: Annotated[list[str] | None, typer.Option(
        help="Topics to reset (repeatable); default: those the group has offsets for.")] = None,
    execute: Annotated[bool, typer.Option(
        "--execute", help="Apply; without it, only show what would be set (dry run).")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Reset committed offsets, as kafka-consumer-groups --reset-offsets (dry run unless
    --execute)."""
    chosen = [k for k, v in (("earliest", to_earliest), ("latest", to_latest),
                             ("offset", to_offset is not None),
                             ("datetime", to_datetime is not None)) if v]
    if len(chosen) != 1:
        raise LakelogError("give exactly one of --to-earliest, --to-latest, --to-offset, "
                           "--to-datetime")
    body: dict[str, Any] = {"to": chosen[0], "dry_run": not execute}
    if to_offset is not None:
        body["offset"] = to_offset
    if to_datetime is not None:
        body["datetime"] = to_datetime.replace("Z", "+00:00")
    if topic:
        body["topics"] = topic
    with admin(url) as client:
        r = client.reset_group_offsets(group, body)
    # Kafka's table: GROUP TOPIC PARTITION NEW-OFFSET.
    rows = [("GROUP", "TOPIC", "PARTITION", "NEW-OFFSET")] + [
        (group, o["topic_name"], str(o["partition_id"]), str(o["offset"])) for o in r["offsets"]]
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    for row in rows:
        typer.echo("  ".join(v.ljust(w) for v, w in zip(row, widths, strict=True)).rstrip())
    typer.echo("(dry run: add --execute to apply)" if r["dry_run"] else "offsets reset",
               err=True)


@groups_app.command("skip-corrupt")
def groups_skip_corrupt(
    group: Annotated[str, typer.Argument(help="The group (it must have no members).")],
    topic: Annotated[list[str] | None, typer.Option(
        help="Only this topic (repeatable); default: every topic the group has offsets for.")
    ] = None,
    execute: Annotated[bool, typer.Option(
        "--execute", help="Commit; without it, only show what would be skipped.")] = False,
    url: Url = DEFAULT_URL,
) -> None:
    """Move committed offsets that stand at a damaged batch (410 corrupt_record) past it;
    the damaged records are lost to the group. Dry run unless --execute."""
    moves = []
    with admin(url) as client:
        for o in client.list_group_offsets(group):
            t, p, offset = o["topic_name"], o["partition_id"], o["offset"]
            if topic and t not in topic:
                continue
            start = offset
            for _ in range(1000):  # damaged batches in a row: bounded
                r = client.request("GET", f"/topics/{t}/partitions/{p}/records?offset={offset}"
                                   "&max_records=1", ok=(200, 410, 416))
                if r.get("error") != "corrupt_record":
                    break
                typer.echo(f"{t}-{p}: offsets {r['first_offset']}..{r['last_offset']} damaged "
                           f"({r['file']} at byte {r['file_position']})", err=True)
                offset = r["next_offset"]
            if offset != start:
                moves.append({"topic_name": t, "partition_id": p, "offset": offset})
                typer.echo(f"{t}-{p}\t{start} -> {offset}")
        if moves and execute:
            client.alter_group_offsets(group, moves)
    typer.echo("no committed offset stands at a damaged batch" if not moves else
               "(dry run: add --execute to apply)" if not execute else "offsets moved", err=True)


@groups_app.command("delete")
def groups_delete(group: Annotated[str, typer.Argument(help="The group (no members).")],
                  url: Url = DEFAULT_URL) -> None:
    """Delete a group and its committed offsets."""
    with admin(url) as client:
        client.delete_group(group)
    typer.echo(f"deleted consumer group {group}")

