"""``log_tables.spark.tails`` and ``.leaders``: where a data directory's readers find its broker and key,
and the leader fetch that reads what the data directory lacks, against a real server
(the three-broker case is ``tests/cluster/test_spark_tails.py``)."""

from __future__ import annotations

import logging
import ssl
from pathlib import Path

import httpx
import pyarrow as pa
import pytest

from lakelog.client import Producer
from log_tables.cold.topic_reader import SPARK_SCHEMA, PartitionBounds, read_range
from log_tables.errors import LakelogError
from log_tables.layout import Layout
from log_tables.leadership import write_cluster_id
from log_tables.spark.leaders import LeaderBound, leader_bounds, merged
from log_tables.spark.tails import BROKER_KEY, TailSource, fetch_range, tail_source
from tests.server import ServerProcess

CA_PEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def test_a_broker_s_data_directory_names_its_url_and_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAKELOG_API_KEY", raising=False)
    layout = Layout.of(tmp_path)
    assert tail_source(layout) is None  # a cluster of one: no cluster.json
    write_cluster_id(tmp_path, "c1", 2)
    assert tail_source(layout) is None  # written before brokers gave their address
    (tmp_path / "ca.pem").write_text(CA_PEM)
    write_cluster_id(tmp_path, "c1", 2, "https://b2:8443", str(tmp_path / "ca.pem"))
    # the bundle itself travels to the tasks, not its path (none there on another machine)
    assert tail_source(layout) == TailSource("https://b2:8443", CA_PEM, None, "c1")
    (tmp_path / BROKER_KEY).parent.mkdir()
    (tmp_path / BROKER_KEY).write_text("llk_b2:s3cret\n")
    source = tail_source(layout)
    assert source is not None and source.api_key == "llk_b2:s3cret"
    assert "s3cret" not in repr(source)
    monkeypatch.setenv("LAKELOG_API_KEY", "llk_me:mine")
    source = tail_source(layout)
    assert source is not None and source.api_key == "llk_me:mine"


def test_a_leader_s_bounds_count_where_they_are_further() -> None:
    here = PartitionBounds(log_start_offset=5, tiered_offset=40, high_watermark=60)
    assert merged(here, None) == here
    assert merged(here, LeaderBound(-1, None, 0, 900, 0)) == here  # offline: nothing to fetch
    assert merged(here, LeaderBound(2, "u", 7, 90, 0)) == PartitionBounds(7, 40, 90)
    assert merged(here, LeaderBound(2, "u", 0, 50, 0)) == PartitionBounds(5, 40, 60)


def test_a_broker_that_does_not_answer_leaves_the_read_local(
        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        assert leader_bounds(TailSource("http://127.0.0.1:1"), ["t"]) is None
    assert "did not answer" in caplog.text


def test_a_ca_bundle_that_cannot_be_used_here_leaves_the_read_local(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """cluster.json names a CA bundle at a path the reading machine lacks, or a file that
    holds no certificate: the read holds what the data directory holds, with a warning."""
    layout = Layout.of(tmp_path)

    def leaders() -> object:
        source = tail_source(layout)
        return None if source is None else leader_bounds(source, ["t"])

    write_cluster_id(tmp_path, "c1", 2, "https://127.0.0.1:1", str(tmp_path / "gone.pem"))
    with caplog.at_level(logging.WARNING):
        assert leaders() is None
    assert "gone.pem (named in cluster.json) cannot be read here" in caplog.text
    assert "reading only the partitions' tails held here" in caplog.text
    caplog.clear()
    (tmp_path / "not-a-ca.pem").write_text("not a certificate\n")
    write_cluster_id(tmp_path, "c1", 2, "https://127.0.0.1:1", str(tmp_path / "not-a-ca.pem"))
    with caplog.at_level(logging.WARNING):
        assert leaders() is None
    assert "holds no usable certificate" in caplog.text
    # a task given such a bundle says so in lakelog's terms, not as an ssl.SSLError
    with pytest.raises(LakelogError, match="holds no usable certificate"):
        list(fetch_range(TailSource("https://127.0.0.1:1", "not a certificate"), None,
                         "t", 0, 0, 10))


@pytest.mark.slow
def test_fetched_records_equal_the_local_ones_cut_at_the_end(tmp_path: Path) -> None:
    """Over HTTPS, the certificate checked against the CA bundle the broker names."""
    import trustme

    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert_path, key_path, ca_path = tmp_path / "cert.pem", tmp_path / "key.pem", tmp_path / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(cert_path))
    cert.private_key_pem.write_to_path(str(key_path))
    ca.cert_pem.write_to_path(str(ca_path))
    server = ServerProcess(tmp_path / "data", env={"LAKELOG_TLS_CERT": str(cert_path),
                                                   "LAKELOG_TLS_KEY": str(key_path)})
    server.scheme = "https"
    server.verify = ssl.create_default_context(cafile=str(ca_path))
    server.start()
    try:
        r = httpx.post(f"{server.url}/v3/clusters/lakelog/topics", verify=server.verify,
                       json={"topic_name": "t", "partitions_count": 1}, timeout=30)
        assert r.status_code == 201, r.text
        with Producer(server.url, linger_ms=1, verify=str(ca_path)) as producer:
            for n in range(2500):
                producer.send("t", f"v{n}", key=f"k{n}", partition=0,
                              headers=[("h", b"x")] if n % 7 == 0 else ())
                if n % 400 == 0:
                    producer.flush(30)  # several stored batches
            producer.flush(30)
        assert leader_bounds(TailSource(server.url), ["t"]) is None  # the CA is not trusted
        source = TailSource(server.url, ca_path.read_text())
        bounds = leader_bounds(source, ["t"])
        assert bounds is not None and bounds["t"][0].high_watermark == 2500
        ca_path.unlink()  # as on an executor without the file: the source carries the bundle
        got = list(fetch_range(source, None, "t", 0, 10, 2345))
        assert all(rb.schema == SPARK_SCHEMA for rb in got)
        local = list(read_range(Layout.of(tmp_path / "data"), "t", 0, 10, 2345))
        assert pa.Table.from_batches(got).equals(pa.Table.from_batches(local))
        assert pa.Table.from_batches(got).column("offset").to_pylist() == list(range(10, 2345))
    finally:
        server.stop()
