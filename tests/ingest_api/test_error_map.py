"""The HTTP front's map of the one error table: a status and a Confluent code for each
class, a name and code pair that leads back to it, and an instance's detail answered
apart (a full disk is 507)."""

from __future__ import annotations

import errno

import pytest

from ingest_api.http.errors import HTTP, for_code, status_of, wire_of
from lakelog.client.errors import class_of
from log_tables import errors as e


def test_each_class_has_its_wire_fields_and_one_code_and_name_pair() -> None:
    pairs = set()
    for cls in e.ERRORS:
        status, code = HTTP[cls]
        # Confluent's code: the status, or the status times 100 plus a detail number.
        assert 400 <= status < 600 and (code // 100 == status or code == status), cls
        assert (code, cls.code) not in pairs, cls
        pairs.add((code, cls.code))


def test_a_body_leads_back_to_its_class_shared_codes_by_name() -> None:
    # Confluent's 40002 is a taken topic name; lakelog answers an invalid one with it too.
    assert class_of("topic_already_exists", 40002) is e.TopicExistsError
    assert class_of("invalid_topic", 40002) is e.InvalidTopicError
    assert class_of("unknown_topic_or_partition", 40403) is e.UnknownTopicError
    assert class_of("unknown_topic_or_partition", 40402) is e.UnknownPartitionError
    assert class_of("corrupt_record", 41001) is e.CorruptRecordError
    assert class_of("storage_error", 50701) is e.StorageError  # a full disk's code
    assert class_of("no_such_error", 99999) is e.LakelogError
    assert HTTP[e.TopicExistsError] == HTTP[e.InvalidTopicError] == (400, 40002)


def test_a_full_disk_is_its_own_status() -> None:
    assert wire_of(e.StorageError("x", errno.ENOSPC)) == (507, 50701)
    assert wire_of(e.StorageError("x", errno.EIO)) == (500, 50001)
    assert status_of(e.StorageError("x", errno.ENOSPC))[:3] == (507, 50701, "storage_error")


def test_a_class_outside_the_table_answers_as_the_table_class_it_derives_from() -> None:
    class Narrower(e.UnknownGroupError):
        pass

    assert wire_of(Narrower("g")) == (404, 40405)


def test_each_code_and_name_pair_leads_back_to_its_class() -> None:
    for cls in e.ERRORS:
        assert for_code(HTTP[cls][1], cls.code) is cls, cls


def test_for_code_resolves_shared_codes_by_name() -> None:
    assert for_code(40002, "topic_already_exists") is e.TopicExistsError
    assert for_code(40002, "invalid_topic") is e.InvalidTopicError
    assert for_code(40403) is e.UnknownTopicError
    assert for_code(40402, "unknown_topic_or_partition") is e.UnknownPartitionError
    assert for_code(41001) is e.CorruptRecordError
    assert for_code(50701, "storage_error") is e.StorageError  # a full disk's code
    assert for_code(99999, "no_such_error") is e.LakelogError


def test_the_old_paths_of_renamed_and_moved_error_names_still_import() -> None:
    with pytest.warns(DeprecationWarning, match=r"log_tables\.errors\.for_code moved: "
                                                r"import it from ingest_api\.http\.errors"):
        from log_tables.errors import for_code as old_for_code
    assert old_for_code is for_code
    with pytest.warns(DeprecationWarning, match=r"lakelog\.endpoint\.process\.PortTaken "
                                                r"moved: import it from log_tables\.errors "
                                                r"\(`from log_tables\.errors import "
                                                r"PortTakenError`\)"):
        from lakelog.endpoint.process import PortTaken
    assert PortTaken is e.PortTakenError
