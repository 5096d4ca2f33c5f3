"""``lakelog topics create --replication-factor`` (kafka-topics.sh's spelling) and the
admin client's ``replication_factor`` against one real server: 1 is taken, more is
refused saying that this server runs alone, and ``--config replication.factor`` points
at the flag. (A cluster taking 3: tests/cluster/test_routing.py.)"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lakelog.client import AdminClient, LakelogClientError
from tests.server import LAKELOG, ServerProcess

pytestmark = pytest.mark.slow


def _lakelog(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("LAKELOG_API_KEY", "LAKELOG_URL")}
    return subprocess.run([str(LAKELOG), *args, "--url", server.url], capture_output=True,
                          text=True, timeout=60, env=env)


def test_topics_create_takes_kafkas_replication_factor_flag(server: ServerProcess) -> None:
    done = _lakelog(server, "topics", "create", "one", "--partitions", "2",
                    "--replication-factor", "1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "created topic one (2 partition(s), replication factor 1)"
    done = _lakelog(server, "topics", "create", "three", "--replication-factor", "3")
    assert done.returncode == 1
    assert "replication_factor 3 is more than the 1 live broker: this server runs alone" \
        in done.stderr, done.stderr
    assert "not supported" not in done.stderr and "keeps 1 copy" not in done.stderr
    done = _lakelog(server, "topics", "create", "cfg", "--config", "replication.factor=3")
    assert done.returncode == 1
    assert "replication.factor is not a topic config: `topics create --replication-factor " \
        "3` sets it" in done.stderr, done.stderr
    done = _lakelog(server, "topics", "create", "zero", "--replication-factor", "0")
    assert done.returncode == 2  # a usage error, before any request
    described = _lakelog(server, "topics", "describe", "one")
    assert "replication factor 1" in described.stdout


def test_admin_client_create_topic_takes_a_replication_factor(server: ServerProcess) -> None:
    with AdminClient(server.url) as admin:
        assert admin.create_topic("one", 1, replication_factor=1)["replication_factor"] == 1
        assert admin.create_topic("default", 1)["replication_factor"] == 1
        with pytest.raises(LakelogClientError) as err:
            admin.create_topic("three", 1, replication_factor=3)
        assert err.value.status == 400 and err.value.code == "invalid_replication_factor"
        assert "this server runs alone" in str(err.value)
        assert [t["topic_name"] for t in admin.list_topics()] == ["default", "one"]


def test_help_names_the_flag(tmp_path: Path) -> None:
    done = subprocess.run([str(LAKELOG), "topics", "create", "--help"], capture_output=True,
                          text=True, timeout=60, env={**os.environ, "COLUMNS": "200"})
    assert "--replication-factor" in done.stdout
