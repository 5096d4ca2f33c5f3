"""``lakelog cluster up/down``: ZooKeeper and N brokers on this machine, for trying a cluster."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lakelog.cli.root import DEFAULT_URL, Url, admin, app
from lakelog.endpoint import DEFAULT_SQL_PORT

cluster_app = typer.Typer(help="A local cluster: ZooKeeper and N brokers on loopback.",
                          no_args_is_help=True)
app.add_typer(cluster_app, name="cluster")

Dir = Annotated[Path, typer.Option(
    "--dir", help="Where the cluster keeps its data, logs and cluster.json.")]
DEFAULT_DIR = Path("lakelog-cluster")


@cluster_app.command("up")
def cluster_up(
    brokers: Annotated[int | None, typer.Option(
        min=1, help="How many brokers (ids 1..N); default 3, or the count of the cluster "
                    "already in DIR.")] = None,
    directory: Dir = DEFAULT_DIR,
    zookeeper: Annotated[str | None, typer.Option(
        help="A running ZooKeeper HOST:PORT (or HOST:PORT/CHROOT); unset: start one in "
             "DIR/zookeeper (Debian's zookeeper package).")] = None,
    auth: Annotated[str | None, typer.Option(
        help="api-key (the default; the admin key is in the data directory of the broker "
             "that made it: 'up' prints where) or none.")] = None,
    sql_port: Annotated[int | None, typer.Option(
        min=0, max=65535, help=f"Spark Connect port of broker 1's SQL endpoint; 0: none "
                               f"(default {DEFAULT_SQL_PORT}) [LAKELOG_SQL_PORT].")] = None,
) -> None:
    """Start ZooKeeper and the brokers as background processes; 'cluster down' stops them.
    On a DIR whose cluster is up, start those of its processes that are not running (on
    their ports) and leave the others alone."""
    from lakelog.local_cluster import STATE_FILE, Cluster, up
    from log_tables.errors import LakelogError

    if auth not in (None, "api-key", "none"):
        raise LakelogError(f"--auth {auth!r}: api-key or none")
    before = Cluster.load(directory.absolute())
    running = {b.id for b in before.brokers if b.process.alive()} if before else set()
    zk_running = before is not None and before.zookeeper_process is not None and \
        before.zookeeper_process.alive()
    cluster = up(directory, brokers, zookeeper, auth, sql_port=sql_port)
    if cluster.zookeeper_process is None:
        zk_line = f"{cluster.zookeeper} (given)"
    else:
        zk_line = f"{cluster.zookeeper}  pid {cluster.zookeeper_process.pid}  " \
                  f"{'running' if zk_running else 'started'}  log {cluster.zookeeper_log}"
    lines = [f"lakelog cluster up in {cluster.directory}", f"  zookeeper  {zk_line}"]
    for b in cluster.brokers:
        sql = f"  sql sc://127.0.0.1:{b.sql_port}" if b.sql_port else ""
        lines.append(f"  broker {b.id}   pid {b.process.pid}  {b.url}  "
                     f"{'running' if b.id in running else 'started'}{sql}  "
                     f"data {b.data_dir}  log {b.log}")
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
    if running and len(running) == len(cluster.brokers) and (zk_running or
                                                          cluster.zookeeper_process is None):
        typer.echo("every process of the cluster was running: nothing started", err=True)


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
