#!/usr/bin/env python3
"""Writes the seed corpus of the store protocol fuzzer (tests/data/store-fuzz-corpus/).

Frames are built here from docs/store-protocol.md independently of the C++ encoder, so the seeds double as a
check that the document and the code agree (the fuzzer's round-trip check fails on a seed that disagrees).
Run from anywhere: python3 tests/fuzz/make_store_corpus.py
"""
import os
import struct

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "data", "store-fuzz-corpus")

PING, SET, GET, ADD, CAS, DELETE, WAIT, BARRIER, NUM_KEYS = range(1, 10)


def b(s):
    return s if isinstance(s, bytes) else s.encode()


def string(s):
    s = b(s)
    return struct.pack(">I", len(s)) + s


def frame(body):
    return struct.pack(">I", len(body)) + body


def req(op, payload=b""):
    return frame(bytes([op]) + payload)


seeds = {
    "ping": req(PING),
    "set": req(SET, string("rank/0") + string("10.0.0.1:4242")),
    "set-binary-value": req(SET, string("k") + string(b"\x00\xff\x00\x01")),
    "set-empty-key-and-value": req(SET, string("") + string("")),
    "get-now": req(GET, struct.pack(">I", 0) + string("rank/0")),
    "get-wait": req(GET, struct.pack(">I", 30000) + string("rank/1")),
    "add": req(ADD, struct.pack(">q", 1) + string("counter")),
    "add-negative": req(ADD, struct.pack(">q", -9223372036854775808) + string("counter")),
    "compare-set": req(CAS, bytes([0]) + string("leader") + string("old") + string("new")),
    "compare-set-expect-absent": req(CAS, bytes([1]) + string("leader") + string("") + string("me")),
    "delete": req(DELETE, string("rank/0")),
    "wait-3-keys": req(WAIT, struct.pack(">II", 1000, 3) + string("a") + string("bb") + string("ccc")),
    "wait-0-keys": req(WAIT, struct.pack(">II", 0, 0)),
    "barrier": req(BARRIER, struct.pack(">II", 60000, 4) + string("epoch/1")),
    "num-keys": req(NUM_KEYS),
    "pipelined-set-get-add": req(SET, string("x") + string("1"))
    + req(GET, struct.pack(">I", 0) + string("x"))
    + req(ADD, struct.pack(">q", 5) + string("n")),
    # Edge cases: every rejection path.
    "edge-empty-frame": frame(b""),
    "edge-unknown-opcode": req(0x63),
    "edge-truncated-set": req(SET, struct.pack(">I", 10) + b"abc"),
    "edge-trailing-bytes": req(PING, b"\x00\x00"),
    "edge-key-over-limit": req(SET, string("k" * 65) + string("v")),
    "edge-key-size-field-huge": req(SET, b"\xff\xff\xff\xff"),
    "edge-value-over-limit": req(SET, string("k") + string("v" * 257)),
    "edge-frame-over-limit": struct.pack(">I", 0x40000000) + bytes([SET]),
    "edge-frame-header-only": struct.pack(">I", 12),
    "edge-half-frame": req(SET, string("key") + string("value"))[:9],
    "edge-wait-too-many-keys": req(WAIT, struct.pack(">II", 0, 9) + b"".join(string("k") for _ in range(9))),
    "edge-wait-count-exceeds-body": req(WAIT, struct.pack(">II", 0, 1000) + string("k")),
    "edge-barrier-zero-participants": req(BARRIER, struct.pack(">II", 0, 0) + string("b")),
    "edge-cas-unknown-flags": req(CAS, bytes([2]) + string("k") + string("") + string("")),
    "edge-cas-absent-with-expected": req(CAS, bytes([1]) + string("k") + string("x") + string("")),
    # Handshake messages (the same input also goes through the request decoder).
    "hello-server": b"DTRS" + struct.pack(">HBB", 1, 0, 0) + bytes(range(32)) + struct.pack(">IIII", 4096, 1 << 24, 1 << 25, 4096),
    "hello-server-busy": b"DTRS" + struct.pack(">HBB", 1, 1, 0) + bytes(32) + struct.pack(">IIII", 64, 256, 1024, 8),
    "hello-client": b"DTRC" + struct.pack(">HH", 1, 0) + bytes(range(32)) + bytes(range(32, 64)),
    "hello-client-wrong-version": b"DTRC" + struct.pack(">HH", 2, 0) + bytes(64),
    # Replies (for the client's decoder).
    "reply-ok": frame(bytes([0])),
    "reply-get": frame(bytes([0]) + string("value")),
    "reply-add": frame(bytes([0]) + struct.pack(">q", 42)),
    "reply-compare-set": frame(bytes([0, 1, 1]) + string("new")),
    "reply-num-keys": frame(bytes([0]) + struct.pack(">Q", 7)),
    "reply-timeout": frame(bytes([2]) + string("wait timed out after 100 ms; missing: 'a'")),
}

os.makedirs(OUT, exist_ok=True)
for name, data in sorted(seeds.items()):
    with open(os.path.join(OUT, name), "wb") as f:
        f.write(data)
print(f"wrote {len(seeds)} seeds to {os.path.normpath(OUT)}")
