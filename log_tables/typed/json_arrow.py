"""JSON Schema values as Arrow columns.

An ``object`` with ``properties`` is a struct of them (in the schema's order, each
nullable), an ``array`` with ``items`` a list, ``integer`` a 64-bit integer, ``number``
a double, ``boolean``, ``string`` (any ``format``) a string; a type list of one type and
``null`` is that type. ``$ref`` is followed within the document (``#/$defs/...``,
``#/definitions/...``) and into the schema's references by name. Anything else (an
object without properties, ``oneOf``/``anyOf``, a type list of several types, a
recursive ``$ref``) has no one column type: it is kept as its JSON text, a string.
A value that does not fit its column (a string where the schema says integer) fails
its record, as a schema-checked producer would have refused it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import msgspec
import pyarrow as pa

from log_tables.typed.registry_state import Schema

Fix = Callable[[Any], Any]
SCALARS = {"integer": pa.int64(), "number": pa.float64(), "boolean": pa.bool_(),
           "string": pa.string()}


def _as_text(v: Any) -> Any:
    return None if v is None else json.dumps(v, separators=(",", ":"), sort_keys=True)


def _check(kind: str) -> Fix:
    def check(v: Any) -> Any:
        if v is None:
            return None
        ok = {"integer": (isinstance(v, int) and not isinstance(v, bool))
              or (isinstance(v, float) and v.is_integer()),
              "number": isinstance(v, int | float) and not isinstance(v, bool),
              "boolean": isinstance(v, bool), "string": isinstance(v, str)}[kind]
        if not ok:
            raise ValueError(f"{json.dumps(v)[:40]} is not a JSON {kind}")
        return int(v) if kind == "integer" else v
    return check


class JsonShape:
    """A JSON Schema's Arrow type and the per-value fix-up that fits values to it."""

    def __init__(self, doc: Any, named: Mapping[str, Any]) -> None:
        self.root = doc
        self.named = named
        self._open: set[int] = set()
        self.arrow_type, self.fix = self._shape(doc)

    def _resolve(self, ref: str) -> Any:
        if ref in self.named:
            return self.named[ref]
        if ref.startswith("#/"):
            node = self.root
            for part in ref[2:].split("/"):
                node = node[part.replace("~1", "/").replace("~0", "~")]
            return node
        raise KeyError(ref)

    def _shape(self, s: Any) -> tuple[pa.DataType, Fix]:
        if not isinstance(s, dict):
            return pa.string(), _as_text
        if "$ref" in s:
            if id(s) in self._open:
                return pa.string(), _as_text  # recursive: no fixed shape
            try:
                target = self._resolve(str(s["$ref"]))
            except (KeyError, TypeError, IndexError):
                return pa.string(), _as_text
            self._open.add(id(s))
            try:
                return self._shape(target)
            finally:
                self._open.discard(id(s))
        kind = s.get("type")
        if isinstance(kind, list):
            real = [k for k in kind if k != "null"]
            kind = real[0] if len(real) == 1 else None
        if kind in SCALARS:
            return SCALARS[kind], _check(kind)
        if kind == "array" and isinstance(s.get("items"), dict):
            item_type, item_fix = self._shape(s["items"])

            def fix_list(v: Any) -> Any:
                if v is None:
                    return None
                if not isinstance(v, list):
                    raise ValueError("not a JSON array")
                return [item_fix(x) for x in v]
            return pa.list_(item_type), fix_list
        if kind in ("object", None) and isinstance(s.get("properties"), dict) and s["properties"]:
            props = [(name, *self._shape(sub)) for name, sub in s["properties"].items()]

            def fix_object(v: Any) -> Any:
                if v is None:
                    return None
                if not isinstance(v, dict):
                    raise ValueError("not a JSON object")
                return {name: fix(v.get(name)) for name, _, fix in props}
            return pa.struct([pa.field(name, t) for name, t, _ in props]), fix_object
        return pa.string(), _as_text


class JsonDecoder:
    """Decodes Confluent-framed JSON payloads of one schema id into Arrow."""

    def __init__(self, schema: Schema, references: Mapping[str, Schema]) -> None:
        named = {name: json.loads(used.text) for name, used in references.items()}
        self.shape = JsonShape(json.loads(schema.text), named)
        self.arrow_type = self.shape.arrow_type
        self._decode = msgspec.json.Decoder()

    def decode_one(self, payload: bytes) -> Any:
        try:
            value = self._decode.decode(payload)
        except msgspec.DecodeError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        return self.shape.fix(value)

    def to_arrow(self, values: list[Any]) -> pa.Array:
        return pa.array(values, type=self.arrow_type)
