"""``lakelog acls`` and ``lakelog keys``: who may do what, and their API keys."""

from __future__ import annotations

from typing import Annotated

import typer

from lakelog.cli.root import DEFAULT_URL, Url, admin, app
from log_tables.errors import LakelogError

acls_app = typer.Typer(help="ACLs: who may do what on which topics and groups (admin only).",
                       no_args_is_help=True)
app.add_typer(acls_app, name="acls")
Principal = Annotated[str, typer.Option(help="The principal (the name an API key belongs to).")]


def _acl(principal: str, operation: str, topic: str | None, group: str | None, cluster: bool,
         prefix: bool) -> dict[str, str]:
    if sum((topic is not None, group is not None, cluster)) != 1:
        raise LakelogError("name exactly one of --topic, --group or --cluster")
    kind, name = (("topic", topic) if topic is not None else ("group", group)
                  if group is not None else ("cluster", "lakelog"))
    return {"principal": principal, "operation": operation, "resource_type": kind,
            "resource_name": str(name), "pattern_type": "prefixed" if prefix else "literal"}


Operation = Annotated[str, typer.Option(
    help="produce, consume, describe, alter, delete (topics); consume, commit, describe, alter, "
         "delete (groups); describe or admin (--cluster).")]
AclTopic = Annotated[str | None, typer.Option(help="A topic name (or prefix with --prefix).")]
AclGroup = Annotated[str | None, typer.Option(help="A group name (or prefix with --prefix).")]
AclCluster = Annotated[bool, typer.Option("--cluster", help="The cluster (for admin).")]
Prefix = Annotated[bool, typer.Option("--prefix", help="The name is a prefix.")]


@acls_app.command("add")
def acls_add(principal: Principal, operation: Operation, topic: AclTopic = None,
             group: AclGroup = None, cluster: AclCluster = False, prefix: Prefix = False,
             url: Url = DEFAULT_URL) -> None:
    """Allow PRINCIPAL to do OPERATION on a topic, a group or the cluster."""
    wanted = _acl(principal, operation, topic, group, cluster, prefix)
    with admin(url) as client:
        acl = client.create_acl(wanted)
    typer.echo(f"allowed {acl['principal']} to {acl['operation']} on {acl['resource_type']} "
               f"{acl['resource_name']}{'*' if acl['pattern_type'] == 'prefixed' else ''}")


@acls_app.command("remove")
def acls_remove(principal: Principal, operation: Operation, topic: AclTopic = None,
                group: AclGroup = None, cluster: AclCluster = False, prefix: Prefix = False,
                url: Url = DEFAULT_URL) -> None:
    """Remove one ACL (exit 1 if there is no such ACL)."""
    unwanted = _acl(principal, operation, topic, group, cluster, prefix)
    with admin(url) as client:
        client.delete_acl(unwanted)
    typer.echo("removed")


@acls_app.command("list")
def acls_list(principal: Annotated[str | None, typer.Option(help="Only this principal's.")] = None,
              url: Url = DEFAULT_URL) -> None:
    """PRINCIPAL  OPERATION  RESOURCE per line (a trailing * marks a prefix)."""
    with admin(url) as client:
        acls = client.list_acls(principal)
    for a in acls:
        star = "*" if a["pattern_type"] == "prefixed" else ""
        typer.echo(f"{a['principal']}\t{a['operation']}\t{a['resource_type']}:"
                   f"{a['resource_name']}{star}")


keys_app = typer.Typer(help="API keys (admin only): create, list, delete.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(principal: Annotated[str, typer.Argument(help="Who the key is for.")],
                url: Url = DEFAULT_URL) -> None:
    """Make a key and print it as '<key id>:<secret>' (the secret is shown only now)."""
    with admin(url) as client:
        key = client.create_api_key(principal)
    typer.echo(f"{key['key_id']}:{key['secret']}")


@keys_app.command("list")
def keys_list(url: Url = DEFAULT_URL) -> None:
    """Key ids and their principals (never secrets)."""
    with admin(url) as client:
        keys = client.list_api_keys()
    for k in keys:
        typer.echo(f"{k['key_id']}\t{k['principal']}")


@keys_app.command("delete")
def keys_delete(key_id: Annotated[str, typer.Argument(help="The key id.")],
                url: Url = DEFAULT_URL) -> None:
    """Revoke a key."""
    with admin(url) as client:
        client.delete_api_key(key_id)
    typer.echo(f"deleted {key_id}")

