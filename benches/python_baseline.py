"""Baselines for `cargo bench --bench process`: the same per-message job in Python — msgpack,
zlib, JSON, and the classification the consumer being replaced does — on the same fixtures, with
three JSON decoders:
- `json`: the standard library, as that consumer does it;
- `orjson`: the fastest drop-in `loads` (builds every object of every event);
- `msgspec`: typed, lazy decoding: each event's `data` stays raw bytes unless the event is a
  custom event, which is the best a Python consumer can do without skipping validation.
Prints one line per variant: MiB/s of decompressed JSON per CPU-second on one core.

Run: pip install msgpack==1.1.0 orjson==3.13.0 msgspec==0.22.0 && python3 benches/python_baseline.py
"""

import json
import pathlib
import time
import zlib

import msgpack
import msgspec
import orjson

FIXTURES = sorted((pathlib.Path(__file__).parent.parent / "fixtures" / "segments").glob("*.msgpack"))


def body(value: bytes) -> tuple[int, bytes]:
    message = msgpack.unpackb(value, raw=False)
    header, payload = message["payload"].split(b"\n", 1)
    return json.loads(header)["segment_id"], zlib.decompress(payload) if payload[:1] != b"[" else payload


def classify(events, counts, categories, clicks, crumb_of) -> None:
    """Counts events by type and breadcrumbs by category; keeps click details."""
    for kind, data in events:
        counts[kind] = counts.get(kind, 0) + 1
        if kind != 5:
            continue
        payload = crumb_of(data)
        if payload is None:
            continue
        category = payload.get("category")
        categories[category] = categories.get(category, 0) + 1
        if category in ("ui.click", "ui.slowClickDetected"):
            node = (payload.get("data") or {}).get("node")
            if node and node.get("id", -1) >= 0:
                clicks.append((payload["timestamp"], node["id"], node.get("tagName", "")[:32]))


def dict_crumb(data):
    return data["payload"] if data.get("tag") == "breadcrumb" else None


def process_with(loads):
    def process(value: bytes) -> dict:
        segment_id, data = body(value)
        events = ((e.get("type"), e.get("data")) for e in loads(data))
        counts, categories, clicks = {}, {}, []
        classify(events, counts, categories, clicks, dict_crumb)
        return {"segment_id": segment_id, "bytes": len(data), "counts": counts, "clicks": clicks[:20]}

    return process


class Event(msgspec.Struct):
    type: int
    data: msgspec.Raw = msgspec.Raw(b"null")


class Custom(msgspec.Struct):
    tag: str = ""
    payload: msgspec.Raw = msgspec.Raw(b"null")


EVENTS = msgspec.json.Decoder(list[Event])
CUSTOM = msgspec.json.Decoder(Custom)
ANY = msgspec.json.Decoder()


def msgspec_crumb(raw):
    custom = CUSTOM.decode(raw)
    return ANY.decode(custom.payload) if custom.tag == "breadcrumb" else None


def process_msgspec(value: bytes) -> dict:
    segment_id, data = body(value)
    events = ((e.type, e.data) for e in EVENTS.decode(data))
    counts, categories, clicks = {}, {}, []
    classify(events, counts, categories, clicks, msgspec_crumb)
    return {"segment_id": segment_id, "bytes": len(data), "counts": counts, "clicks": clicks[:20]}


VARIANTS = {
    "json": process_with(json.loads),
    "orjson": process_with(orjson.loads),
    "msgspec": process_msgspec,
}


def main() -> None:
    values = [path.read_bytes() for path in FIXTURES]
    reference = [VARIANTS["json"](v) for v in values]
    for name, process in VARIANTS.items():
        assert [process(v) for v in values] == reference, f"{name} classifies differently"
        total = sum(r["bytes"] for r in reference)
        # CPU time, as examples/process_cpu measures `process`: time the process spent
        # preempted is not the path's.
        rounds, start = 0, time.process_time()
        while time.process_time() - start < 5:
            for value in values:
                process(value)
            rounds += 1
        elapsed = time.process_time() - start
        print(f"python {name}: {total * rounds / elapsed / (1 << 20):.1f} MiB/s of decompressed JSON ({rounds} rounds)")


if __name__ == "__main__":
    main()
