"""The columns of a typed table and how they evolve.

A row is a record: the Kafka metadata columns (``partition``, ``offset``, ``timestamp``,
``key``, ``headers``), the key decoded (``typed_key``, when the topic's key has a
schema) and, beside them, the value's fields as columns of their own (a value that is
not a record is one column, ``value``). A field named like one of those columns is
``value_<name>``. A tombstone (null value) is a row whose value columns are
null (in an upsert table it deletes its key's row instead).

Schemas evolve by name: a new field is a new column (older rows read null), a field
gone stays a column (newer rows null), nested records evolve the same way; a field whose
type changes to another is a conflict (``TypeConflict``): the table cannot hold both
without a rewrite, so such records are not written (``delta.errors.mode``).
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa

from log_tables.cold.rows import TIMESTAMP_TYPE
from log_tables.records import HEADERS_TYPE

META_FIELDS = [pa.field("partition", pa.int32(), nullable=False),
               pa.field("offset", pa.int64(), nullable=False),
               pa.field("timestamp", TIMESTAMP_TYPE, nullable=False),
               pa.field("key", pa.binary()),
               pa.field("headers", HEADERS_TYPE)]
META_NAMES = frozenset(f.name for f in META_FIELDS)
TYPED_KEY = "typed_key"
"""The key decoded with its schema, when the topic has one (``<topic>-key``)."""
VALUE_COLUMN = "value"
"""The column of a value that is not a record."""


def typed_app_id(partition: int) -> str:
    """The typed table's app transaction of a partition: the offset it covers up to."""
    return f"lakelog-typed-{partition}"


def dlq_app_id(partition: int) -> str:
    """The dead-letter table's: the offset its rows of the partition cover up to."""
    return f"lakelog-dlq-{partition}"


class TypeConflict(ValueError):
    """Two types of one column that no table holds both of."""


def column_name(field_name: str) -> str:
    return f"value_{field_name}" if field_name in META_NAMES | {TYPED_KEY} else field_name


def value_fields(value_type: pa.DataType) -> list[pa.Field]:
    """The table columns of a value type (nullable: older or newer schemas lack them)."""
    if pa.types.is_struct(value_type):
        return [pa.field(column_name(f.name), f.type) for f in value_type]
    return [pa.field(VALUE_COLUMN, value_type)]


def merge_type(a: pa.DataType, b: pa.DataType, where: str) -> pa.DataType:
    """A type holding values of both (fields by name, nested), or ``TypeConflict``."""
    if a == b:
        return a
    if pa.types.is_null(a):
        return b
    if pa.types.is_null(b):
        return a
    if pa.types.is_struct(a) and pa.types.is_struct(b):
        return pa.struct(merge_fields(list(a), list(b), where + "."))
    if pa.types.is_map(a) and pa.types.is_map(b):
        return pa.map_(merge_type(a.key_type, b.key_type, where),
                       merge_type(a.item_type, b.item_type, where))
    if pa.types.is_list(a) and pa.types.is_list(b):
        return pa.list_(merge_type(a.value_type, b.value_type, where + "[]"))
    raise TypeConflict(f"column {where.rstrip('.')} is {a} in the table but {b} in this "
                       "schema (an incompatible change: the table would need rewriting)")


def merge_fields(old: Sequence[pa.Field], new: Sequence[pa.Field], prefix: str = ""
                 ) -> list[pa.Field]:
    """``old`` with ``new``'s fields merged in by name (new names last, in their order)."""
    out = {f.name: f for f in old}
    for f in new:
        have = out.get(f.name)
        out[f.name] = f.with_nullable(True) if have is None else have.with_type(
            merge_type(have.type, f.type, prefix + f.name))
    return list(out.values())


def conform(array: pa.Array, target: pa.DataType) -> pa.Array:
    """``array`` as ``target`` (a merge of its type): missing fields null, at any depth."""
    if array.type == target:
        return array
    if pa.types.is_null(array.type):
        return pa.nulls(len(array), target)
    if pa.types.is_struct(target):
        assert isinstance(array, pa.StructArray)
        names = {f.name: i for i, f in enumerate(array.type)}
        children = [conform(array.field(names[f.name]), f.type) if f.name in names
                    else pa.nulls(len(array), f.type) for f in target]
        return pa.StructArray.from_arrays(children, fields=list(target),
                                          mask=array.is_null() if array.null_count else None)
    if pa.types.is_map(target):
        assert isinstance(array, pa.MapArray)
        return pa.MapArray.from_arrays(_offsets(array), array.keys,
                                       conform(array.items, target.item_type), type=target)
    if pa.types.is_list(target):
        assert isinstance(array, pa.ListArray)
        return pa.ListArray.from_arrays(_offsets(array), conform(array.values, target.value_type),
                                        type=target)
    return array.cast(target)


def _offsets(array: pa.ListArray | pa.MapArray) -> pa.Array:
    """The offsets with nulls where the lists are null (``from_arrays`` reads them so)."""
    offsets = array.offsets
    if not array.null_count:
        return offsets
    mask = pa.concat_arrays([array.is_null(), pa.array([False])])
    return pa.compute.if_else(mask, pa.nulls(len(offsets), offsets.type), offsets)


def as_columns(value: pa.Array) -> pa.StructArray:
    """Values as a struct of their table columns (``value_fields``): a null value has
    every column null."""
    fields = value_fields(value.type)
    if not pa.types.is_struct(value.type):
        return pa.StructArray.from_arrays([value], fields=fields)
    assert isinstance(value, pa.StructArray)
    return pa.StructArray.from_arrays([value.field(i) for i in range(value.type.num_fields)],
                                      fields=fields,
                                      mask=value.is_null() if value.null_count else None)
