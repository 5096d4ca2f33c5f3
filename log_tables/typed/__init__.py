"""Typed topics: values in Confluent's wire format decoded into Arrow columns, for the
typed and upsert tables (``delta.table.mode``: docs/typed-tables.md) and the readers
of them.

The schema registry's state (``registry_state``, which the broker's registry serves)
read from a replica of ``__schemas`` (``catalog``); each format's schemas as Arrow
types and its values decoded (``avro_arrow`` with ``avro_block``, ``json_arrow``,
``proto_arrow`` on ``protobuf``); a batch of values decoded by schema id (``decode``);
the table's columns and how they evolve (``columns``); raw rows as typed and
dead-letter rows (``rows``); where a topic's typed table stands (``status``). Imports
``cold/`` and ``hot/``; ``spark/`` imports it.
"""
