#!/usr/bin/env python3
"""An independent consumer of kvconnect's KV events, written against vLLM's
wire (vllm/distributed/kv_events.py), not against the Go code.

It subscribes to the PUB endpoint with pyzmq (libzmq), reads --count
batches, decodes each multipart message [topic, seq, payload] and the
msgpack payload as vLLM's event classes define it, then asks the replay
endpoint over a DEALER socket for every batch from --replay-from on, and
prints one JSON object:

  {"live": [batch...], "replay": [batch...], "end": [frames as hex]}

A replay reply is parsed as vLLM >= 0.26 sends it (vLLM PR 45177) and as
llm-d-router v0.10.0 reads it: after the empty delimiter exactly three
frames, [topic, seq, payload] per batch and ["", -1, ""] at the end;
anything else fails. With --legacy-replay, the form before vLLM 0.26:
[seq, payload] and [-1, ""], with no topic.

A batch is {"topic" (null in a legacy replay, whose replies carry none),
"seq", "ts", "dp_rank", "events"} and an event
is {"type", "encoding" ("map" or "array"), "keys" (the map's keys in wire
order, or null), "fields" (every field of the class, by name)}.

Requirements: python3-zmq and python3-msgpack (Debian packages).
"""

import argparse
import json
import sys

import msgpack
import zmq

# vLLM's event classes: the fields in declaration order, and how many of
# them come first without a default (required on the wire). A field with
# a default (None) may be left out: msgspec's omit_defaults.
CLASSES = {
    "BlockStored": ([
        "block_hashes", "parent_block_hash", "token_ids", "block_size",
        "lora_id", "medium", "lora_name", "extra_keys", "group_idx",
        "kv_cache_spec_kind", "kv_cache_spec_sliding_window",
    ], 7),
    "BlockRemoved": (["block_hashes", "medium", "group_idx"], 2),
    "AllBlocksCleared": ([], 0),
}

# The end of a replay: -1 as a signed 64-bit big-endian integer.
END_SEQ = (-1).to_bytes(8, "big", signed=True)


def fail(msg):
    print(f"check_consumer: {msg}", file=sys.stderr)
    sys.exit(1)


def decode_event(obj):
    if isinstance(obj, dict):
        # Tagged map (vLLM since PR 42892): the tag under "type".
        tag = obj.get("type")
        if tag not in CLASSES:
            fail(f"event tag {tag!r} is not a vLLM event class")
        names, required = CLASSES[tag]
        keys = list(obj.keys())
        unknown = [k for k in keys if k != "type" and k not in names]
        if unknown:
            fail(f"{tag}: fields {unknown} are not vLLM's")
        missing = [n for n in names[:required] if n not in obj]
        if missing:
            fail(f"{tag}: required fields {missing} missing")
        fields = {n: obj.get(n) for n in names}
        return {"type": tag, "encoding": "map", "keys": keys, "fields": fields}
    if isinstance(obj, (list, tuple)):
        # Positional array (msgspec array_like=True): the tag first.
        if not obj or obj[0] not in CLASSES:
            fail(f"event {obj!r}: no vLLM tag first")
        tag, values = obj[0], list(obj[1:])
        names, required = CLASSES[tag]
        if not required <= len(values) <= len(names):
            fail(f"{tag}: {len(values)} positional fields, want {required} to {len(names)}")
        fields = {n: (values[i] if i < len(values) else None) for i, n in enumerate(names)}
        return {"type": tag, "encoding": "array", "keys": None, "fields": fields}
    fail(f"event {obj!r}: neither a map nor an array")


def decode_batch(topic, seq, payload):
    if len(seq) != 8:
        fail(f"sequence frame of {len(seq)} bytes, want 8")
    batch = msgpack.unpackb(payload, raw=False, strict_map_key=False)
    # EventBatch, array_like: [ts, events, data_parallel_rank].
    if not isinstance(batch, list) or len(batch) not in (2, 3):
        fail(f"payload {batch!r}: want [ts, events, data_parallel_rank]")
    ts, events = batch[0], batch[1]
    if not isinstance(ts, float):
        fail(f"ts {ts!r}: want a float")
    return {
        "topic": None if topic is None else topic.decode("utf-8"),
        "seq": int.from_bytes(seq, "big"),
        "ts": ts,
        "dp_rank": batch[2] if len(batch) == 3 else None,
        "events": [decode_event(e) for e in events],
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pub", required=True)
    ap.add_argument("--replay", required=True)
    ap.add_argument("--topic", default="")
    ap.add_argument("--count", type=int, required=True)
    ap.add_argument("--replay-from", type=int, default=0)
    ap.add_argument("--timeout-ms", type=int, default=20000)
    ap.add_argument("--legacy-replay", action="store_true")
    # --bind: the SUB binds --pub (tcp://127.0.0.1:* for a port of the
    # system's choice), as in llm-d's static-endpoint mode, for a publisher
    # that connects; it prints {"bound": endpoint} on a line first.
    # --replay - reads the replay endpoint from stdin after that line.
    ap.add_argument("--bind", action="store_true")
    args = ap.parse_args()

    ctx = zmq.Context()
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.LINGER, 0)
    sub.setsockopt_string(zmq.SUBSCRIBE, args.topic)
    if args.bind:
        sub.bind(args.pub)
        bound = sub.getsockopt(zmq.LAST_ENDPOINT).decode()
        print(json.dumps({"bound": bound}), flush=True)
    else:
        sub.connect(args.pub)
    replay_endpoint = args.replay
    if replay_endpoint == "-":
        replay_endpoint = sys.stdin.readline().strip()
    # The Go side waits until the publisher counts this subscription, then
    # publishes: no fixed sleep, nothing lost to the slow-joiner race.
    live = []
    while len(live) < args.count:
        if not sub.poll(args.timeout_ms):
            fail(f"timed out after {len(live)} of {args.count} live batches")
        frames = sub.recv_multipart()
        if len(frames) != 3:
            fail(f"live message of {len(frames)} frames, want [topic, seq, payload]")
        live.append(decode_batch(*frames))

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(replay_endpoint)
    # A DEALER sends the empty delimiter that a REQ socket would add.
    dealer.send_multipart([b"", args.replay_from.to_bytes(8, "big")])
    replay, end = [], None
    while end is None:
        if not dealer.poll(args.timeout_ms):
            fail(f"replay timed out after {len(replay)} batches")
        frames = dealer.recv_multipart()
        if not frames or frames[0] != b"":
            fail(f"replay reply of frames {frames!r}: no empty delimiter")
        parts = frames[1:]
        if args.legacy_replay:
            if len(parts) != 2:
                fail(f"legacy replay reply of {len(parts)} frames, want [seq, payload]")
            parts = [None] + parts
        elif len(parts) != 3:
            fail(f"malformed replay frame with {len(parts)} frames, want [topic, seq, payload]")
        topic, seq, payload = parts
        if seq == END_SEQ:
            if payload != b"" or topic not in (None, b""):
                fail(f"replay end marker {frames!r}: want an empty topic and payload")
            end = [f.hex() for f in frames]
            break
        if topic is not None and not topic.startswith(args.topic.encode()):
            fail(f"replay topic {topic!r} does not match the subscription {args.topic!r}")
        replay.append(decode_batch(topic, seq, payload))

    json.dump({"live": live, "replay": replay, "end": end}, sys.stdout)
    print()
    sub.close()
    dealer.close()
    ctx.term()


if __name__ == "__main__":
    main()
