"""Baseline for `cargo bench --bench process`: the same per-message job in Python, the way the
consumer being replaced does it (msgpack + zlib + json.loads + classification), on the same
fixtures. Prints MB/s of decompressed JSON on one core.

Run: pip install msgpack==1.1.0 && python3 benches/python_baseline.py
"""

import json
import pathlib
import time
import zlib

import msgpack

FIXTURES = sorted((pathlib.Path(__file__).parent.parent / "fixtures" / "segments").glob("*.msgpack"))


def process(value: bytes) -> dict:
    message = msgpack.unpackb(value, raw=False)
    header, body = message["payload"].split(b"\n", 1)
    segment_id = json.loads(header)["segment_id"]
    data = zlib.decompress(body) if body[:1] != b"[" else body
    events = json.loads(data)
    counts, categories, clicks = {}, {}, []
    for event in events:
        counts[event.get("type")] = counts.get(event.get("type"), 0) + 1
        if event.get("type") == 5 and event["data"].get("tag") == "breadcrumb":
            payload = event["data"]["payload"]
            category = payload.get("category")
            categories[category] = categories.get(category, 0) + 1
            if category in ("ui.click", "ui.slowClickDetected"):
                node = payload.get("data", {}).get("node")
                if node and node.get("id", -1) >= 0:
                    clicks.append((payload["timestamp"], node["id"], node.get("tagName", "")[:32]))
    return {"segment_id": segment_id, "bytes": len(data), "counts": counts, "clicks": clicks[:20]}


def main() -> None:
    values = [path.read_bytes() for path in FIXTURES]
    total = sum(process(v)["bytes"] for v in values)
    rounds, start = 0, time.perf_counter()
    while time.perf_counter() - start < 5:
        for value in values:
            process(value)
        rounds += 1
    elapsed = time.perf_counter() - start
    print(f"python baseline: {total * rounds / elapsed / (1 << 20):.1f} MiB/s of decompressed JSON ({rounds} rounds)")


if __name__ == "__main__":
    main()
