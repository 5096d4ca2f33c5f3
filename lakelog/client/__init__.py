"""A Python client for lakelog's HTTP API (httpx): ``Producer`` and ``Consumer``.

    from lakelog.client import Consumer, Producer

    with Producer("http://127.0.0.1:8080") as producer:
        producer.send("orders", b"order 1", key=b"customer-7")   # a Future of RecordMetadata
        producer.flush()

    with Consumer("http://127.0.0.1:8080", "billing", ["orders"],
                  auto_offset_reset="earliest") as consumer:
        for record in consumer.poll(timeout_s=1.0):
            print(record.partition, record.offset, record.value)
        consumer.commit()

The producer (``producer.py``) batches per partition, partitions keyed records with
Kafka's murmur2 and is idempotent by default; after a refused record the records behind
it go on. The consumer (``consumer.py``) is a member of a group (server-side
assignment, cooperative revocation). Both ride through a server restart with Kafka's
retry settings (``retry.py``), retrying what the server's answer calls ``retriable``, and
raise a ``LakelogClientError`` (``errors.py``): the server's error answer, typed as the
class it names (a ``RecordTooLargeError`` of ``log_tables.errors``, say), or
``LakelogTimeoutError`` when the deadline passed. A poll
that reaches records stored in a damaged batch raises ``CorruptRecordError`` (which
names them and ``next_offset``); ``seek`` past them to go on.

Credentials: ``api_key="<key id>:<secret>"``, else the ``LAKELOG_API_KEY`` variable,
else the profile (``~/.config/lakelog/config.toml``, for its url), else the admin key a
local server wrote (``$LAKELOG_DATA_DIR/security/admin.key``, ``./lakelog-data`` by
default). For HTTPS with a private CA, pass ``verify="ca.pem"`` (or set
``SSL_CERT_FILE``).
"""

from lakelog.client.consumer import Consumer
from lakelog.client.errors import (
    RETRIABLE_STATUS,
    CorruptRecordError,
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
)
from lakelog.client.producer import Producer
from lakelog.client.structs import Record, RecordMetadata, TopicPartition
from lakelog.client.transport import CLUSTER, default_api_key, http_auth, tls_verify

__all__ = [
    "CLUSTER",
    "RETRIABLE_STATUS",
    "Consumer",
    "CorruptRecordError",
    "LakelogClientError",
    "LakelogConnectionError",
    "LakelogTimeoutError",
    "Producer",
    "Record",
    "RecordMetadata",
    "TopicPartition",
    "default_api_key",
    "http_auth",
    "tls_verify",
]
