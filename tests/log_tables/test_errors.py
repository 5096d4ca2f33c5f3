"""The one error table: every error lakelog raises is in it, once, with its name, its
Kafka name and whether it is retriable (its HTTP status is the front's)."""

from __future__ import annotations

import errno
import importlib
import pkgutil

import consumer_groups
import log_tables
from log_tables import errors as e


def _subclasses(cls: type[e.LakelogError]) -> set[type[e.LakelogError]]:
    out = set()
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out


def test_every_error_of_the_domain_packages_is_in_the_table() -> None:
    for package in (log_tables, consumer_groups):
        for module in pkgutil.walk_packages(package.__path__, package.__name__ + "."):
            if "spark" not in module.name:  # Spark modules start a JVM on import of pyspark
                importlib.import_module(module.name)
    domain = {cls for cls in _subclasses(e.LakelogError)
              if cls.__module__.split(".")[0] in ("log_tables", "consumer_groups")}
    assert domain <= set(e.ERRORS), domain - set(e.ERRORS)
    assert len(set(e.ERRORS)) == len(e.ERRORS)


def test_each_class_has_its_fields_and_knows_no_http() -> None:
    """Status and Confluent code are the HTTP front's (``ingest_api.http.errors``, tested
    in ``tests/ingest_api/test_error_map.py``), not the bottom floor's."""
    for cls in e.ERRORS:
        assert cls.code and cls.code == cls.code.lower(), cls
        assert isinstance(cls.retriable, bool)
        assert cls.kafka_name is None or cls.kafka_name == cls.kafka_name.upper(), cls
        assert not hasattr(cls, "status") and not hasattr(cls, "error_code"), cls
        assert e.for_name(cls.code) is cls or cls.code in e.SHARED_NAMES, cls


def test_kafka_names_where_kafka_has_them() -> None:
    assert e.OffsetOutOfRangeError.kafka_name == "OFFSET_OUT_OF_RANGE"
    assert e.CorruptRecordError.kafka_name == "CORRUPT_MESSAGE"
    assert e.RecordTooLargeError.kafka_name == "MESSAGE_TOO_LARGE"
    assert e.UnknownMemberError.kafka_name == "UNKNOWN_MEMBER_ID"


def test_a_full_disk_is_its_own_detail() -> None:
    assert e.StorageError("x", errno.ENOSPC).detail == e.DISK_FULL
    assert e.StorageError("x", errno.EDQUOT).detail == e.DISK_FULL
    assert e.StorageError("x", errno.EIO).detail is None
    assert e.StorageError("x").retriable and not e.StaleTableError("x").retriable
