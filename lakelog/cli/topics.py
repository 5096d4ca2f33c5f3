"""``lakelog topics``: create, list, describe, alter, delete."""

from __future__ import annotations

from typing import Annotated

import typer

from lakelog.cli.root import DEFAULT_URL, Url, admin, app
from log_tables.errors import LakelogError

topics_app = typer.Typer(help="Topics: create, list, describe, alter, delete.",
                         no_args_is_help=True)
app.add_typer(topics_app, name="topics")


def _configs(items: list[str] | None) -> list[tuple[str, str]]:
    out = []
    for item in items or ():
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise LakelogError(f"--config {item!r}: expected NAME=VALUE, e.g. retention.ms=3600000")
        if name == "replication.factor":  # as in Kafka, not a topic config
            raise LakelogError(f"replication.factor is not a topic config: `topics create "
                               f"--replication-factor {value}` sets it when a topic is made")
        out.append((name, value))
    return out


ConfigOpt = Annotated[list[str] | None, typer.Option(
    "--config", help="NAME=VALUE topic config (repeatable), e.g. cleanup.policy=compact.")]


@topics_app.command("create")
def topics_create(name: Annotated[str, typer.Argument(help="The topic.")],
                  partitions: Annotated[int, typer.Option(help="Partition count.")] = 1,
                  replication_factor: Annotated[int | None, typer.Option(
                      min=1, help="Copies of each partition, at most the live brokers; "
                                  "default: the server's default_replication_factor.")] = None,
                  config: ConfigOpt = None, url: Url = DEFAULT_URL) -> None:
    """Create a topic."""
    configs = _configs(config)
    with admin(url) as client:
        made = client.create_topic(name, partitions, configs, replication_factor)
    typer.echo(f"created topic {name} ({partitions} partition(s), replication factor "
               f"{made.get('replication_factor', replication_factor or 1)})")


@topics_app.command("list")
def topics_list(url: Url = DEFAULT_URL) -> None:
    """Every topic and its partition count."""
    with admin(url) as client:
        topics = client.list_topics()
    for t in topics:
        typer.echo(f"{t['topic_name']}\tpartitions={t['partitions_count']}")


@topics_app.command("describe")
def topics_describe(name: Annotated[str, typer.Argument(help="The topic.")],
                    url: Url = DEFAULT_URL) -> None:
    """Partitions as kafka-topics --describe shows them (Partition, Leader, Replicas, Isr;
    a leader of -1: offline), with their offsets and sizes, and the configs that differ
    from the defaults."""
    with admin(url) as client:
        topic = client.describe_topic(name)
        typer.echo(f"topic {name}: {topic['partitions_count']} partition(s), "
                   f"replication factor {topic['replication_factor']}")
        rows = [["Partition", "Leader", "Replicas", "Isr", "LeaderEpoch", "LogStart",
                 "HighWatermark", "Bytes"]]
        for p in client.list_partitions(name):
            rows.append([str(p["partition_id"]), str(p.get("leader_id", 1)),
                         ",".join(map(str, p.get("replica_ids", [1]))),
                         ",".join(map(str, p.get("isr_ids", [1]))),
                         str(p.get("leader_epoch", 0)), str(p["log_start_offset"]),
                         str(p["high_watermark"]), str(p["size_bytes"])])
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        for r in rows:
            typer.echo("  " + "  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)).rstrip())
        for c in client.describe_configs(name):
            if not c.get("is_default", False):
                typer.echo(f"  {c['name']}={c['value']}")


@topics_app.command("alter")
def topics_alter(name: Annotated[str, typer.Argument(help="The topic.")],
                 partitions: Annotated[int | None, typer.Option(
                     help="Raise the partition count (never lower).")] = None,
                 config: ConfigOpt = None,
                 delete_config: Annotated[list[str] | None, typer.Option(
                     help="Reset a config to its default (repeatable).")] = None,
                 url: Url = DEFAULT_URL) -> None:
    """Raise partitions and set or reset configs."""
    if partitions is None and not config and not delete_config:
        raise LakelogError("nothing to alter: give --partitions, --config or --delete-config")
    if partitions is not None:
        with admin(url) as client:
            client.create_partitions(name, partitions)
    configs = _configs(config)
    if configs or delete_config:
        with admin(url) as client:
            client.alter_configs(name, configs, delete_config or ())
    typer.echo(f"altered topic {name}")


@topics_app.command("delete")
def topics_delete(name: Annotated[str, typer.Argument(help="The topic.")],
                  url: Url = DEFAULT_URL) -> None:
    """Delete a topic and its data (both tiers)."""
    with admin(url) as client:
        client.delete_topic(name)
    typer.echo(f"deleted topic {name}")

