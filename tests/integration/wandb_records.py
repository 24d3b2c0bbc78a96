"""Read an offline W&B run file (`run-*.wandb`) record by record, with wandb's own protobuf definitions.

wandb 0.31 ships no Python reader. The file is a LevelDB-style log: a 7-byte header (":W&B", magic 0xBEE1,
version), then 32 KiB blocks of chunks, each a 7-byte chunk header (CRC32, little-endian length, type:
1 full, 2 first, 3 middle, 4 last) and its bytes; a block's tail shorter than a chunk header is zero
padding. A record is one full chunk, or a first, middles and a last joined.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

BLOCK = 32 * 1024
FILE_HEADER = 7
CHUNK_HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def raw_records(path: Path) -> list[bytes]:
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:FILE_HEADER])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), f"{path}: not a W&B run file"
    records, pending, pos = [], b"", FILE_HEADER
    while pos + CHUNK_HEADER <= len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < CHUNK_HEADER:
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + CHUNK_HEADER])
        if length == 0 and kind == 0:  # zero padding at the end of a block, or the unwritten end of the file
            pos += left_in_block
            continue
        body = data[pos + CHUNK_HEADER : pos + CHUNK_HEADER + length]
        pos += CHUNK_HEADER + length
        if kind == FULL:
            records.append(body)
        elif kind == FIRST:
            pending = body
        elif kind == MIDDLE:
            pending += body
        elif kind == LAST:
            records.append(pending + body)
            pending = b""
    return records


def records(path: Path) -> list[Any]:
    from wandb.proto import wandb_internal_pb2 as pb

    out = []
    for raw in raw_records(path):
        rec = pb.Record()
        rec.ParseFromString(raw)
        out.append(rec)
    return out


def _value(item: Any) -> Any:
    return json.loads(item.value_json)


def _key(item: Any) -> str:
    return item.key or "/".join(item.nested_key)


def _put(out: dict[str, Any], item: Any) -> None:
    """A nested key (a logged table's fields) goes in as nested dicts: {"eval/samples": {"nrows": 100, ...}}."""
    if item.key:
        out[item.key] = _value(item)
        return
    *parents, leaf = item.nested_key
    for name in parents:
        out = out.setdefault(name, {})
    out[leaf] = _value(item)


def _of(recs: list[Any], kind: str) -> list[Any]:
    return [getattr(rec, kind) for rec in recs if rec.WhichOneof("record_type") == kind]


def _merged(records_: list[Any], field: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for rec in records_:
        for item in getattr(rec, field):
            _put(out, item)
        for item in getattr(rec, "remove", []):
            out.pop(_key(item), None)
    return out


def history(recs: list[Any]) -> list[dict[str, Any]]:
    """One dict per logged step: {"_step": n, key: value}."""
    return [_merged([h], "item") for h in _of(recs, "history")]


def summary(recs: list[Any]) -> dict[str, Any]:
    """The run's summary as it stands after the last summary record."""
    return _merged(_of(recs, "summary"), "update")


def config(recs: list[Any]) -> dict[str, Any]:
    return _merged(_of(recs, "config"), "update")


def artifacts(recs: list[Any]) -> list[Any]:
    return _of(recs, "artifact")


def run_file(output_dir: Path) -> Path:
    (found,) = list((output_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    return found
