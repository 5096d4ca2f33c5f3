"""A Python client for lakelog's HTTP API (httpx): ``Producer``, ``Consumer`` and
``AdminClient``.

    from lakelog.client import Consumer, Producer

    with Producer("http://127.0.0.1:8080") as producer:
        producer.send("orders", b"order 1", key=b"customer-7")   # a Future of RecordMetadata
        producer.flush()

    with Consumer("http://127.0.0.1:8080", "billing", ["orders"],
                  auto_offset_reset="earliest") as consumer:
        for record in consumer.poll(timeout_s=1.0):
            print(record.partition, record.offset, record.value)
        consumer.commit()

The client is split by role, as aiokafka's: value types in ``structs.py``, errors in
``errors.py``, credentials, TLS and the httpx client in ``http.py``, retries in
``retry.py``, and one module per role. The producer (``producer.py``, with
``batches.py``) batches per partition (``linger_ms``, ``batch_size``), keeps up to
``max_in_flight_requests_per_connection`` requests in flight (one per partition),
partitions keyed records with Kafka's murmur2 and is idempotent by default; after a
refused record the records behind it go on. ``send_many`` counts many records' answers
in a ``Tally`` instead of a Future each. The consumer (``consumer.py``, on
``commits.py`` and ``membership.py``) is a member of a group (server-side
assignment, cooperative revocation). The admin client (``admin.py``) makes the calls of
``lakelog topics|groups|acls|keys``: topics, groups, ACLs, API keys, deleted records and
segment rolls. All ride through a server restart with Kafka's retry settings
(``retry.py``), retrying what the server's answer calls ``retriable``, and raise a
``LakelogClientError`` (``errors.py``): the server's error answer, typed as the class it
names (a ``RecordTooLargeError`` of ``log_tables.errors``, say), or
``LakelogTimeoutError`` when the deadline passed. A poll that reaches records
stored in a damaged batch raises ``CorruptRecordError`` (which names them and
``next_offset``); ``seek`` past them to go on.

Transactions, as Kafka's transactional producer: ``Producer(url,
transactional_id="...")``, then ``init_transactions()``, ``begin_transaction()``,
sends, ``send_offsets_to_transaction(offsets, consumer.group_metadata())`` and
``commit_transaction()`` or ``abort_transaction()`` (``transactions.py``); a
``Consumer(..., isolation_level="read_committed")`` reads only committed records.

Credentials: ``api_key="<key id>:<secret>"``, else the ``LAKELOG_API_KEY`` variable,
else the profile (``~/.config/lakelog/config.toml``, for its url), else the admin key a
local server wrote (``$LAKELOG_DATA_DIR/security/admin.key``, ``./lakelog-data`` by
default). For HTTPS with a private CA, pass ``verify="ca.pem"`` (or set
``SSL_CERT_FILE``).
"""

from lakelog.client.admin import AdminClient
from lakelog.client.batches import Tally
from lakelog.client.consumer import Consumer
from lakelog.client.errors import (
    RETRIABLE_STATUS,
    CorruptRecordError,
    LakelogClientError,
    LakelogConnectionError,
    LakelogTimeoutError,
)
from lakelog.client.http import CLUSTER, default_api_key, http_auth, tls_verify
from lakelog.client.producer import Producer
from lakelog.client.structs import Record, RecordMetadata, TopicPartition
from lakelog.client.transactions import GroupMetadata

__all__ = [
    "CLUSTER",
    "RETRIABLE_STATUS",
    "AdminClient",
    "Consumer",
    "CorruptRecordError",
    "GroupMetadata",
    "LakelogClientError",
    "LakelogConnectionError",
    "LakelogTimeoutError",
    "Producer",
    "Record",
    "RecordMetadata",
    "Tally",
    "TopicPartition",
    "default_api_key",
    "http_auth",
    "tls_verify",
]
