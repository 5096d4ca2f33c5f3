"""The one error table: every error lakelog raises is in it, once, and a body's code and
name lead back to its class."""

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


def test_each_class_has_its_wire_fields_and_one_code_and_name_pair() -> None:
    pairs = set()
    for cls in e.ERRORS:
        assert cls.code and cls.code == cls.code.lower(), cls
        assert 400 <= cls.status < 600 and cls.error_code // 100 == cls.status, cls
        assert isinstance(cls.retriable, bool)
        assert cls.kafka_name is None or cls.kafka_name == cls.kafka_name.upper(), cls
        assert (cls.error_code, cls.code) not in pairs, cls
        pairs.add((cls.error_code, cls.code))
        assert e.for_code(cls.error_code, cls.code) is cls


def test_for_code_resolves_shared_codes_by_name() -> None:
    # Confluent's 40002 is a taken topic name; lakelog answers an invalid one with it too.
    assert e.for_code(40002, "topic_already_exists") is e.TopicExistsError
    assert e.for_code(40002, "invalid_topic") is e.InvalidTopicError
    assert e.for_code(40403) is e.UnknownTopicError
    assert e.for_code(40402, "unknown_topic_or_partition") is e.UnknownPartitionError
    assert e.for_code(41001) is e.CorruptRecordError
    assert e.for_code(50701, "storage_error") is e.StorageError  # a full disk's code
    assert e.for_code(40005, "invalid_replica_assignment") is e.LakelogError  # not a class
    assert e.for_code(99999, "no_such_error") is e.LakelogError


def test_kafka_names_where_kafka_has_them() -> None:
    assert e.OffsetOutOfRangeError.kafka_name == "OFFSET_OUT_OF_RANGE"
    assert e.CorruptRecordError.kafka_name == "CORRUPT_MESSAGE"
    assert e.RecordTooLargeError.kafka_name == "MESSAGE_TOO_LARGE"
    assert e.UnknownMemberError.kafka_name == "UNKNOWN_MEMBER_ID"


def test_a_full_disk_is_its_own_status() -> None:
    assert (e.StorageError("x", errno.ENOSPC).status,
            e.StorageError("x", errno.ENOSPC).error_code) == (507, 50701)
    assert (e.StorageError("x", errno.EIO).status,
            e.StorageError("x", errno.EIO).error_code) == (500, 50001)
    assert e.StorageError("x").retriable and not e.StaleTableError("x").retriable
