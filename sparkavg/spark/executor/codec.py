"""The codec of Spark Connect jobs: values as JSON text plus the raw bytes of arrays.

What a Spark Connect job returns travels as Arrow rows of
:data:`RESULT_SCHEMA` -- never pickled: :func:`encode_value` turns a
result (records, evaluations, failures, statistics payloads, numpy
arrays) into JSON and a list of byte strings, :func:`decode_value`
rebuilds it.  Records and evaluations are found in the one registry
(:func:`sparkavg.configurable.register`): a :class:`~.context.Record`
class registered under the kind ``"result"`` travels as its fields, a
class registered under ``"evaluation"`` as its ``to_dict()`` (rebuilt
with ``from_dict``) -- a new one needs nothing here.  The same encoding
carries shipped values inside a Connect job's closure
(:class:`~sparkavg.spark.connect.ShippedValue`).
"""
from __future__ import annotations

import enum
import json
from typing import Iterable, List, Sequence, Tuple

import numpy as np

from ...configurable import registered
from ..errors import TaskFailure
from .context import Record

__all__ = ["RESULT_SCHEMA", "encode_value", "decode_value", "results_batch", "results_from_table"]

#: One task result per row: JSON text and the raw bytes of its arrays.
RESULT_SCHEMA = "json string, blobs array<binary>"

_TAG = "__sparkavg__"


def _kind(value) -> str:
    return getattr(type(value), "_config_kind", "")


def _registered(kind: str, name: str) -> type:
    cls = registered(kind).get(name)
    if cls is None:
        raise ValueError(f"Expect a {kind} class registered as {name!r} in a task result, got none "
                         f"(registered: {sorted(registered(kind))})")
    return cls


def encode_value(value) -> Tuple[str, List[bytes]]:
    """``value`` as JSON text and the raw bytes of its arrays.

    Understands None, bool, int, float, str, bytes, numpy arrays and
    scalars, lists, tuples, dicts, registered :class:`~.context.Record`
    results and evaluations (see the module docstring) and
    :class:`~sparkavg.spark.errors.TaskFailure`.  Anything else is a
    ``TypeError``: results never travel pickled.
    """
    blobs: List[bytes] = []

    def blob(data: bytes, **meta) -> dict:
        blobs.append(data)
        return {_TAG: meta.pop("kind"), "i": len(blobs) - 1, **meta}

    def enc(v):
        if v is None or isinstance(v, (bool, str)):
            return v
        if isinstance(v, enum.Enum):
            return enc(v.value)
        if isinstance(v, (int, np.integer)):
            return int(v)
        if isinstance(v, (float, np.floating)):
            return float(v)
        if isinstance(v, np.ndarray):
            if v.dtype.kind not in "biuf":
                raise TypeError(f"Expect numeric numpy arrays in task results, got dtype {v.dtype}")
            a = np.ascontiguousarray(v)
            return blob(a.tobytes(), kind="array", dtype=a.dtype.str, shape=list(a.shape))
        if isinstance(v, (bytes, bytearray, memoryview)):
            return blob(bytes(v), kind="bytes")
        if isinstance(v, tuple):
            return {_TAG: "tuple", "items": [enc(x) for x in v]}
        if isinstance(v, list):
            return [enc(x) for x in v]
        if isinstance(v, dict):
            if all(isinstance(k, str) for k in v) and _TAG not in v:
                return {k: enc(x) for k, x in v.items()}
            return {_TAG: "dict", "items": [[enc(k), enc(x)] for k, x in v.items()]}
        if isinstance(v, TaskFailure):
            return {_TAG: "failure", "kind": v.kind, "message": v.message, "where": v.where, "fields": v.fields}
        if isinstance(v, Record) and _kind(v) == "result":
            return {_TAG: "record", "class": type(v)._config_name,
                    "fields": [enc(getattr(v, s)) for s in v.__slots__]}
        if _kind(v) == "evaluation":
            return {_TAG: "evaluation", "class": type(v)._config_name, "value": v.to_dict()}
        raise TypeError(f"Expect plain values in task results (numbers, str, numpy arrays, lists, dicts, records "
                        f"and evaluations registered as 'result' and 'evaluation'): they travel as JSON and "
                        f"bytes, never pickled; got {type(v).__name__}")

    return json.dumps(enc(value), separators=(",", ":")), blobs


def decode_value(text: str, blobs: Sequence) -> object:
    """The value of :func:`encode_value` output; arrays come back writable."""

    def dec(v):
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        tag = v.get(_TAG)
        if tag is None:
            return {k: dec(x) for k, x in v.items()}
        if tag == "array":
            data = blobs[v["i"]]
            data = data.as_buffer() if hasattr(data, "as_buffer") else data
            return np.frombuffer(data, dtype=np.dtype(v["dtype"])).reshape(v["shape"]).copy()
        if tag == "bytes":
            data = blobs[v["i"]]
            return data.as_py() if hasattr(data, "as_py") else bytes(data)
        if tag == "tuple":
            return tuple(dec(x) for x in v["items"])
        if tag == "dict":
            return {dec(k): dec(x) for k, x in v["items"]}
        if tag == "failure":
            return TaskFailure(v["kind"], v["message"], v["where"], v.get("fields"))
        if tag == "record":
            return _registered("result", v["class"])(*[dec(x) for x in v["fields"]])
        if tag == "evaluation":
            return _registered("evaluation", v["class"]).from_dict(v["value"])
        raise ValueError(f"Expect a known tag in a task result, got {tag!r}")

    return dec(json.loads(text))


def results_batch(values: Iterable):
    """Task results as one :data:`RESULT_SCHEMA` record batch."""
    import pyarrow as pa

    texts, blob_lists = [], []
    for value in values:
        text, blobs = encode_value(value)
        texts.append(text)
        blob_lists.append(blobs)
    return pa.RecordBatch.from_pydict({"json": pa.array(texts, pa.string()),
                                       "blobs": pa.array(blob_lists, pa.list_(pa.binary()))})


def results_from_table(table) -> list:
    """Every task result in a collected :data:`RESULT_SCHEMA` table."""
    texts = table.column("json").to_pylist()
    blobs = table.column("blobs")
    out = []
    for i, text in enumerate(texts):
        out.append(decode_value(text, list(blobs[i].values) if blobs[i].is_valid else []))
    return out


