"""``lakelog cluster up/down``: ZooKeeper and N brokers on this machine, for trying a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lakelog.cli.root import DEFAULT_URL, Url, admin, app

cluster_app = typer.Typer(help="A local cluster: ZooKeeper and N brokers on loopback.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

Dir = Annotated[Path, typer.Option(
    "--dir", help="Where the cluster keeps its data, logs and cluster.json.")]
DEFAULT_DIR = Path("lakelog-cluster")


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int, typer.Option(min=1, help="How many brokers (ids 1..N).")] = 3,
    directory: Dir = DEFAULT_DIR,
    zookeeper: Annotated[str | None, typer.Option(
        help="A running ZooKeeper HOST:PORT (or HOST:PORT/CHROOT); unset: start one in DIR/zookeeper "
             "(Debian's zookeeper package).")] = None,
    auth: Annotated[str, typer.Option(
        help="api-key (the admin key is in the data directory of the broker that made it: "
             "'up' prints where) or none.")
    ] = "api-key",
) -> None:
    """Start ZooKeeper and the brokers as background processes; 'cluster down' stops them."""
    from lakelog.local_cluster import STATE_FILE, up
    from log_tables.errors import LakelogError

    if auth not in ("api-key", "none"):
        raise LakelogError(f"--auth {auth!r}: api-key or none")
    cluster = up(directory, brokers, zookeeper, auth)
    zk_where = f"  log {cluster.zookeeper_log}" if cluster.zookeeper_log else " (given)"
    lines = [f"lakelog cluster up in {cluster.directory}",
             f"  zookeeper  {cluster.zookeeper}{zk_where}"]
    lines += [f"  broker {b.id}   {b.url}  data {b.data_dir}  log {b.log}"
              for b in cluster.brokers]
    lines.append(f"  warehouse  {cluster.warehouse}")
    first = cluster.brokers[0].url
    if (key := cluster.admin_key) is not None:
        lines += [f"  admin key  {key}",
                  f"try:  LAKELOG_DATA_DIR={key.parents[1]} lakelog topics list --url {first}"]
    else:
        lines.append(f"try:  lakelog topics list --url {first}")
    lines += [f"state: {Path(cluster.directory) / STATE_FILE}",
              f"stop: lakelog cluster down --dir {cluster.directory}"]
    typer.echo("\n".join(lines))


@cluster_app.command("down")
def cluster_down(directory: Dir = DEFAULT_DIR) -> None:
    """Stop the brokers, then the ZooKeeper 'cluster up' started; the data stays."""
    from lakelog.local_cluster import down

    cluster, killed = down(directory)
    what = f"{len(cluster.brokers)} broker(s)" + (
        " and ZooKeeper" if cluster.zookeeper_process is not None else "")
    typer.echo(f"stopped {what}; data stays in {cluster.directory}")
    if killed:
        typer.echo(f"killed (no clean stop within the deadline): {', '.join(killed)}", err=True)


@cluster_app.command("brokers")
def cluster_brokers(url: Url = DEFAULT_URL) -> None:
    """The live brokers (any broker answers) and which one is the controller."""
    with admin(url) as client:
        controller = str(client.describe_cluster()["controller"]["related"]).rsplit("/", 1)[-1]
        brokers = client.list_brokers()
    typer.echo("BROKER  ADDRESS                RACK    ROLE")
    for b in brokers:
        role = "controller" if str(b["broker_id"]) == controller else ""
        address = f"{b['host']}:{b['port']}"
        typer.echo(f"{b['broker_id']:<7} {address:<22} {b.get('rack') or '-':<7} "
                   f"{role}".rstrip())
