#!/usr/bin/env python3
"""Checks vectors.json against SPEC.md, independently of the Go package.

This is a second implementation of hashing/SPEC.md in another language,
written from the document: it recomputes every identity encoding, digest,
seed, block hash and key of vectors.json from the file's inputs, parses
every dtype name, rejects every invalid input, and recomputes the worked
example. BLAKE3 is the b3sum tool (the BLAKE3 team's Rust implementation;
Debian package b3sum, or `cargo install b3sum`), so no Go code and no Go
BLAKE3 library is involved.

Usage (from the repository root, or anywhere):

    python3 hashing/testdata/check_vectors.py [--b3sum PATH]

It needs only the Python 3 standard library and b3sum. It prints one line
per section and exits non-zero on the first mismatch. The Go test
TestIndependentChecker runs it when python3 and b3sum are installed.
"""

import argparse
import json
import os
import re
import struct
import subprocess
import sys
import unicodedata

HERE = os.path.dirname(os.path.abspath(__file__))
V = 2
TOKEN_CONTEXT = "kvconnect hashing v2 block tokens"
B3SUM = "b3sum"


class Reject(Exception):
    """An input the spec rejects; field names the rule's field as Go does."""

    def __init__(self, field, why):
        super().__init__(f"{field}: {why}")
        self.field = field


# --- section 1 -------------------------------------------------------------


def H(b):
    out = subprocess.run([B3SUM, "--no-names", "--raw"], input=b, capture_output=True, check=True).stdout
    assert len(out) == 32
    return out


def DK(ctx, b):
    out = subprocess.run([B3SUM, "--derive-key", ctx, "--raw"], input=b, capture_output=True, check=True).stdout
    assert len(out) == 32
    return out


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def i64(v):
    return struct.pack("<q", v)


def s(b):
    return u32(len(b)) + b


def tokens_bytes(ts):
    return b"".join(u32(t) for t in ts)


# --- section 3 and 4 -------------------------------------------------------

MAX_EXTRA = 1 << 20
MAX_OFFSET = 1 << 30


def extra_value(e):
    if "value_hex" in e:
        assert "value" not in e
        return bytes.fromhex(e["value_hex"])
    return e.get("value", "").encode("utf-8")


def compile_extras(extras):
    """Returns (seed message, multimodal items) or raises Reject."""
    salt = adapter = None
    opaque = {}
    items = []
    for i, e in enumerate(extras or []):
        k = e["kind"]
        v = extra_value(e)
        h = bytes.fromhex(e.get("hash", "00" * 32))
        if k == "cache_salt":
            f = f"extras[{i}] (cache salt).salt"
            if not v or len(v) > MAX_EXTRA or salt is not None:
                raise Reject(f, "empty, too long or a second salt")
            salt = v
        elif k == "adapter":
            if not v or len(v) > MAX_EXTRA or adapter is not None:
                raise Reject(f"extras[{i}] (adapter).name", "empty, too long or a second adapter")
            if h == bytes(32):
                raise Reject(f"extras[{i}] (adapter).fingerprint", "all zeros")
            adapter = (v, h)
        elif k == "opaque":
            data = bytes.fromhex(e.get("data", ""))
            if not v or len(v) > MAX_EXTRA:
                raise Reject(f"extras[{i}] (opaque).tag", "empty or too long")
            if len(data) > MAX_EXTRA:
                raise Reject(f"extras[{i}] (opaque).data", "too long")
            if v in opaque:
                raise Reject("extras (opaque).tag", "given twice")
            opaque[v] = data
        elif k == "multimodal":
            off, n = e["offset"], e["length"]
            if h == bytes(32):
                raise Reject(f"extras[{i}] (multimodal).contentHash", "all zeros")
            if not 0 <= off <= MAX_OFFSET:
                raise Reject(f"extras[{i}] (multimodal).offset", "out of range")
            if not 1 <= n <= MAX_OFFSET:
                raise Reject(f"extras[{i}] (multimodal).length", "out of range")
            items.append((off, n, h))
        else:
            raise ValueError(f"unknown kind {k}")
    items.sort()
    for (o1, n1, _), (o2, _, _) in zip(items, items[1:]):
        if o1 + n1 > o2:  # Python integers: no overflow
            raise Reject("extras (multimodal).offset", "items overlap")
    msg = bytes([V, 0x02]) + u32((salt is not None) + (adapter is not None) + len(opaque))
    if salt is not None:
        msg += b"\x21" + s(salt)
    if adapter is not None:
        msg += b"\x22" + s(adapter[0]) + adapter[1]
    for tag in sorted(opaque):  # bytes compare bytewise
        msg += b"\x23" + s(tag) + s(opaque[tag])
    return msg, items


def block_extras_message(items, i, n):
    over = [(o, l, h) for (o, l, h) in items if o < (i + 1) * n and o + l > i * n]
    if not over:
        return None
    msg = bytes([V, 0x05]) + u32(len(over))
    for o, l, h in over:
        msg += b"\x24" + h + i64(o - i * n) + u64(l)
    return msg


def chain(n, tokens, extras):
    """Returns (seed, [(extras message, token digest, block message, hash)])."""
    if not 1 <= n <= 4096:
        raise Reject("blockSize", "out of range")
    seed_msg, items = compile_extras(extras)
    parent = seed = H(seed_msg)
    steps = []
    for i in range(len(tokens) // n):
        tb = tokens_bytes(tokens[i * n:(i + 1) * n])
        kind, digest, payload = 0x03, None, tb
        if n > 128:
            kind, digest = 0x04, DK(TOKEN_CONTEXT, tb)
            payload = digest
        xm = block_extras_message(items, i, n)
        msg = bytes([V, kind, 1 if xm else 0, 0]) + u32(n)
        if xm:
            msg += H(xm)
        msg += parent + payload
        parent = H(msg)
        steps.append((xm, digest, msg, parent))
    return seed, steps, seed_msg


# --- section 5 -------------------------------------------------------------


def spec_dtypes():
    """The dtype table of SPEC.md: {canonical: [aliases]}, in order."""
    with open(os.path.join(HERE, "..", "SPEC.md"), encoding="utf-8") as f:
        text = f.read()
    table = text.split("| dtype | aliases | elements |\n| --- | --- | --- |\n", 1)[1].split("\n\n", 1)[0]
    out = {}
    for row in table.split("\n"):
        cells = row.split("|")
        out[re.findall(r"`([^`]*)`", cells[1])[0]] = re.findall(r"`([^`]*)`", cells[2])
    return out


DTYPES = spec_dtypes()
ALIASES = {a: d for d, al in DTYPES.items() for a in al}


def parse_dtype(name):
    """Section 5, "Dtypes": normalise in ASCII, then canonical or alias."""
    b = name.encode("utf-8").strip(b"\t\n\v\f\r ")
    b = bytes(c + 0x20 if 0x41 <= c <= 0x5A else c for c in b)
    l = b.decode("utf-8")
    if l in DTYPES:
        return l
    if l in ALIASES:
        return ALIASES[l]
    raise Reject("dtype", f"not a dtype: {name!r}")


def json_dtype(field, v, optional):
    if v == "":
        if optional:
            return ""
        raise Reject(field, "required")
    return parse_dtype(v)


TENANT = set(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz._-")
ALNUM = set(b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz")


def check_tenant(t):
    if not 1 <= len(t) <= 64 or t[0] not in ALNUM or any(c not in TENANT for c in t):
        raise Reject("Tenant", "outside the tenant alphabet or length")


def check_name(field, b):
    try:
        text = b.decode("utf-8")  # strict: no surrogates, overlongs or > U+10FFFF
    except UnicodeDecodeError:
        raise Reject(field, "not UTF-8")
    if not 1 <= len(b) <= 1024 or any(unicodedata.category(c) == "Cc" for c in text):
        raise Reject(field, "length or a control character")


def check_identity(x):
    """x: dict of bytes / str / int fields. Raises Reject for the first bad field."""
    check_tenant(x["tenant"])
    check_name("Model", x["model"])
    check_name("WeightsVersion", x["weights_version"])
    if not 0 <= x["generation"] < 1 << 64:
        raise Reject("Generation", "out of range")
    d = x["device"]
    if not 1 <= len(d) <= 32 or not (0x61 <= d[0] <= 0x7A) or any(
            not (0x61 <= c <= 0x7A or 0x30 <= c <= 0x39 or c == 0x5F) for c in d):
        raise Reject("Format.Device", "outside the device alphabet")
    for f, k, opt in (("Format.ModelDType", "model_dtype", False), ("Format.KVDType", "kv_dtype", False),
                      ("Format.MLADType", "mla_dtype", True)):
        v = x[k]
        if not (v == b"" and opt) and v.decode("utf-8", "replace") not in DTYPES:
            raise Reject(f, "not a canonical dtype")
    q = x["kv_quant"]
    if len(q) > 256 or any(not 0x21 <= c <= 0x7E for c in q):
        raise Reject("Format.KVQuant", "not printable ASCII without space")
    names = [("Layout.Layers", "layers", 65536), ("Layout.KVHeads", "kv_heads", 65536), ("Layout.HeadDim", "head_dim", 65536),
             ("Layout.BlockSize", "block_size", 4096), ("Layout.TPSize", "tp_size", 65536),
             ("Layout.Replication", "replication", 65536)]
    for f, k, hi in names:
        if not 1 <= x[k] <= hi:
            raise Reject(f, "out of range")
    check_groups(x)
    p, r, k = x["tp_size"], x["replication"], x["kv_heads"]
    groups = x["groups"]
    if groups and all(g["kind"] == STATE for g in groups):
        if k != 1:
            raise Reject("Layout.KVHeads", "must be 1 without attention layers")
        if x["head_dim"] != 1:
            raise Reject("Layout.HeadDim", "must be 1 without attention layers")
        if r != p:
            raise Reject("Layout.Replication", "must equal TP size without attention layers")
        return
    if x["mla_dtype"]:
        if k != 1:
            raise Reject("Layout.KVHeads", "must be 1 with MLA")
        if r != p:
            raise Reject("Layout.Replication", "must equal TP size with MLA")
    if p % r or k % (p // r):
        raise Reject("Layout.Replication", "does not divide TP size or split KV heads")


FULL, SLIDING, STATE = 1, 2, 3
KINDS = {"full": FULL, "sliding_window": SLIDING, "state": STATE}
MAX_GROUPS = 256


def check_groups(x):
    """Section 5, "KV cache groups"."""
    groups, n = x["groups"], x["layers"]
    if not groups:
        return
    if len(groups) > MAX_GROUPS:
        raise Reject("Layout.Groups", "too many groups")
    owner = {}
    for i, g in enumerate(groups):
        f = f"Layout.Groups[{i}]"
        if g["kind"] not in (FULL, SLIDING, STATE):
            raise Reject(f + ".Kind", "unknown or missing")
        if not g["layers"]:
            raise Reject(f + ".Layers", "empty")
        for k, layer in enumerate(g["layers"]):
            if k > 0 and layer <= g["layers"][k - 1]:
                raise Reject(f"{f}.Layers[{k}]", "not strictly increasing")
            if not 0 <= layer < n:
                raise Reject(f"{f}.Layers[{k}]", "out of range")
            if layer in owner:
                raise Reject(f"{f}.Layers[{k}]", "in two groups")
            owner[layer] = i
        if not 1 <= g["block_size"] <= 4096 or g["block_size"] % x["block_size"]:
            raise Reject(f + ".BlockSize", "not a multiple of the hash block size up to 4096")
        if (g["kind"] == SLIDING) != (g["window"] != 0) or not 0 <= g["window"] <= 1 << 30:
            raise Reject(f + ".Window", "a window for sliding-window groups only, 1 to 2^30")
        if (g["kind"] == STATE) != (g["state_bytes"] != 0) or not 0 <= g["state_bytes"] <= 1 << 30:
            raise Reject(f + ".StateBytes", "state bytes for state groups only, 1 to 2^30")
    if len(owner) != n:
        raise Reject("Layout.Groups", "a layer in no group")


def is_default_groups(x):
    """The default layout: no groups, or its one full group written out."""
    g = x["groups"]
    return not g or (len(g) == 1 and g[0] == {"kind": FULL, "layers": list(range(x["layers"])), "block_size": x["block_size"],
                                              "window": 0, "state_bytes": 0})


def group_from_json(g):
    kind = g.get("kind")
    if kind is not None and (not isinstance(kind, str) or kind not in KINDS):
        raise Reject("kind", f"{kind!r}: unknown group kind (known: full, sliding_window, state)")
    return {"kind": KINDS[kind] if kind is not None else 0, "layers": g.get("layers", []), "block_size": g.get("block_size", 0),
            "window": g.get("window", 0), "state_bytes": g.get("state_bytes", 0)}


def identity_from_json(j):
    f, l = j.get("format", {}), j.get("layout", {})
    b = lambda v: v.encode("utf-8")
    return {
        "tenant": b(j.get("tenant", "")), "model": b(j.get("model", "")), "weights_version": b(j.get("weights_version", "")),
        "generation": j.get("generation", 0), "device": b(f.get("device", "")),
        "model_dtype": b(json_dtype("Format.ModelDType", f.get("model_dtype", ""), False)),
        "kv_dtype": b(json_dtype("Format.KVDType", f.get("kv_dtype", ""), False)),
        "kv_quant": b(f.get("kv_quant", "")), "mla_dtype": b(json_dtype("Format.MLADType", f.get("mla_dtype", ""), True)),
        **{k: l.get(k, 0) for k in ("layers", "kv_heads", "head_dim", "block_size", "tp_size", "replication")},
        "groups": [group_from_json(g) for g in l.get("groups", [])],
    }


def encode_identity(x):
    check_identity(x)
    out = bytes([V, 0x01]) + s(x["tenant"]) + s(x["model"]) + s(x["weights_version"]) + u64(x["generation"])
    for k in ("device", "model_dtype", "kv_dtype", "kv_quant", "mla_dtype"):
        out += s(x[k])
    for k in ("layers", "kv_heads", "head_dim", "block_size", "tp_size", "replication"):
        out += u32(x[k])
    groups = [] if is_default_groups(x) else x["groups"]
    out += u32(len(groups))
    for g in groups:
        out += bytes([g["kind"]]) + u32(g["block_size"]) + u32(g["window"]) + u32(g["state_bytes"]) + u32(len(g["layers"]))
        out += b"".join(u32(layer) for layer in g["layers"])
    return out


def decode_identity(b):
    """Decodes an identity encoding; raises Reject (or ValueError) unless canonical and valid."""
    pos = 0

    def take(n):
        nonlocal pos
        if len(b) - pos < n:
            raise Reject("encoding", "truncated")
        pos += n
        return b[pos - n:pos]

    def take_int():
        v = struct.unpack("<I", take(4))[0]
        if v > 0x7FFFFFFF:
            raise Reject("encoding", "a value of 2^31 or more")
        return v

    if take(1) != bytes([V]) or take(1) != b"\x01":
        raise Reject("encoding", "version or kind")
    x = {}
    limits = {"tenant": 64, "model": 1024, "weights_version": 1024}
    for k in ("tenant", "model", "weights_version"):
        n = struct.unpack("<I", take(4))[0]
        if n > limits[k]:
            raise Reject("encoding", "length over its limit")
        x[k] = take(n)
    x["generation"] = struct.unpack("<Q", take(8))[0]
    for k, lim in (("device", 32), ("model_dtype", 32), ("kv_dtype", 32), ("kv_quant", 256), ("mla_dtype", 32)):
        n = struct.unpack("<I", take(4))[0]
        if n > lim:
            raise Reject("encoding", "length over its limit")
        x[k] = take(n)
    for k in ("layers", "kv_heads", "head_dim", "block_size", "tp_size", "replication"):
        x[k] = take_int()
    count = struct.unpack("<I", take(4))[0]
    if count > MAX_GROUPS:
        raise Reject("encoding", "too many groups")
    x["groups"], left = [], 65536
    for _ in range(count):
        g = {"kind": take(1)[0], "block_size": take_int(), "window": take_int(), "state_bytes": take_int()}
        n = struct.unpack("<I", take(4))[0]
        if n > left:
            raise Reject("encoding", "more than 65536 layers in all groups")
        left -= n
        g["layers"] = [take_int() for _ in range(n)]
        x["groups"].append(g)
    if count and is_default_groups(x):
        raise Reject("encoding", "the default layout is encoded as 0 groups")
    if pos != len(b):
        raise Reject("encoding", "trailing bytes")
    check_identity(x)
    return x


# --- section 7 -------------------------------------------------------------

HEX = set("0123456789abcdef")


def canonical_decimal(s):
    return s != "" and s.isascii() and s.isdigit() and (len(s) == 1 or s[0] != "0")


LAYER_END = 65536  # section 7: the largest end of a layer range


def parse_layers(f):
    """The layer field of a layer range's key, l<lo>-<hi>: (lo, hi), or raises Reject."""
    m = re.fullmatch(r"l(0|[1-9][0-9]*)-(0|[1-9][0-9]*)", f)
    if m is None:
        raise Reject("key", "not a canonical layer field l<lo>-<hi>")
    lo, hi = int(m.group(1)), int(m.group(2))
    if not lo < hi <= LAYER_END:
        raise Reject("key", f"not a layer range 0 <= lo < hi <= {LAYER_END}")
    return lo, hi


def parse_key(k):
    """Returns (tenant, ID, shard, group, hash, layers) or raises Reject;
    layers is (lo, hi) for a layer range's key, else None."""
    if len(k.encode("utf-8")) > 512:
        raise Reject("key", "too long")
    parts = k.split("/")
    layers = None
    if len(parts) in (5, 6) and parts[-1].startswith("l"):  # a hash never starts with l
        layers = parse_layers(parts.pop())
    if len(parts) == 4:
        t, i, sh, h = parts
        g = 0
    elif len(parts) == 5:
        t, i, sh, gf, h = parts
        if not gf.startswith("g") or not canonical_decimal(gf[1:]) or not 1 <= int(gf[1:]) <= 255:
            raise Reject("key", "not a canonical group field g1 to g255")
        g = int(gf[1:])
    else:
        raise Reject("key", "not 4 or 5 fields")
    check_tenant(t.encode("utf-8"))
    if len(i) != 32 or set(i) - HEX or len(h) != 64 or set(h) - HEX:
        raise Reject("key", "not lowercase hex")
    if not canonical_decimal(sh) or int(sh) > 65535:
        raise Reject("key", "not a canonical shard")
    return t, i, int(sh), g, h, layers


def key(tenant, ns_id, shard, group, h, layers=None, n=None):
    """Section 7; layers is a range (lo, hi) of the group's n layers, or None for the whole block."""
    k = f"{tenant}/{ns_id}/{shard}/{h}" if group == 0 else f"{tenant}/{ns_id}/{shard}/g{group}/{h}"
    if layers is None:
        return k
    lo, hi = layers
    if not 0 <= lo < hi <= n:
        raise Reject("layers", f"[{lo}, {hi}) is not a range of {n} layers")
    return k if (lo, hi) == (0, n) else f"{k}/l{lo}-{hi}"


def effective_groups(x):
    if x["groups"]:
        return x["groups"]
    return [{"kind": FULL, "layers": list(range(x["layers"])), "block_size": x["block_size"], "window": 0, "state_bytes": 0}]


# --- the checks ------------------------------------------------------------


def expect(cond, what):
    if not cond:
        sys.exit(f"MISMATCH: {what}")


def rejects(fn, field=None):
    try:
        fn()
    except Reject as r:
        return field is None or r.field == field
    return False


def main():
    global B3SUM
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--b3sum", default="b3sum", help="the b3sum binary")
    ap.add_argument("--vectors", default=os.path.join(HERE, "vectors.json"))
    args = ap.parse_args()
    B3SUM = args.b3sum
    with open(args.vectors, encoding="utf-8") as f:
        vf = json.load(f)
    expect(vf["spec_version"] == V and vf["token_context"] == TOKEN_CONTEXT, "spec version and token context")
    expect(H(b"abc").hex() == "6437b3ac38465133ffb63b75273a8db548c558465d79db03fd359c6cd5bd9d85", "b3sum is BLAKE3")

    ids = {}
    for v in vf["identities"]:
        x = identity_from_json(v["identity"])
        enc = encode_identity(x)
        d = H(enc)
        ids[v["name"]] = (x, d)
        tenant = x["tenant"].decode()
        got = dict(encoding=enc.hex(), digest=d.hex(), id=d[:16].hex(), prefix=f"{tenant}/{d[:16].hex()}/",
                   tenant_prefix=tenant + "/", shards=x["tp_size"] // x["replication"],
                   group_shards=[x["tp_size"] if g["kind"] == STATE else x["tp_size"] // x["replication"]
                                 for g in effective_groups(x)])  # section 6
        for k, want in got.items():
            expect(v[k] == want, f"identity {v['name']}: {k} {v[k]}, computed {want}")
        want = dict(x, groups=[] if is_default_groups(x) else x["groups"])
        expect(decode_identity(enc) == want, f"identity {v['name']}: decoding")
    expect(ids["explicit-default-group"][1] == ids["basic"][1], "the default group written out has another digest than none")
    print(f"identities: {len(vf['identities'])} ok")

    hashes = {}
    for v in vf["chains"]:
        seed, steps, _ = chain(v["block_size"], v["tokens"], v["extras"])
        expect(v["seed"] == seed.hex(), f"chain {v['name']}: seed")
        got = [st[3].hex() for st in steps]
        expect(v["hashes"] == got, f"chain {v['name']}: hashes {v['hashes']}, computed {got}")
        hashes[v["name"]] = (v["block_size"], got)
    print(f"chains: {len(vf['chains'])} ok")

    for v in vf["keys"]:
        x, d = ids[v["identity"]]
        n, hs = hashes[v["chain"]]
        expect(n == x["block_size"], f"key {v}: chain of block size {n} under an identity of block size {x['block_size']}")
        g = effective_groups(x)[v["group"]]
        index = (v["block"] + 1) * (g["block_size"] // n) - 1  # section 7: the hash ending with the group block
        shard = v["rank"] if g["kind"] == STATE else v["rank"] // x["replication"]  # section 6
        n_layers = len(g["layers"])
        layers = tuple(v["layers"]) if "layers" in v else None
        k = key(x["tenant"].decode(), d[:16].hex(), shard, v["group"], hs[index], layers, n_layers)
        expect(v["hash_index"] == index and v["shard"] == shard and v["key"] == k,
               f"key {v}: computed hash index {index}, shard {shard}, key {k}")
        parsed_layers = None if layers in (None, (0, n_layers)) else layers  # the whole group's range is the block's key
        expect(parse_key(k) == (x["tenant"].decode(), d[:16].hex(), shard, v["group"], hs[index], parsed_layers), f"key {k}: parse")
    n_layer_keys = sum("layers" in v for v in vf["keys"])
    print(f"keys: {len(vf['keys'])} ok ({n_layer_keys} of layer ranges)")

    for v in vf["dtypes"]:
        if "dtype" in v:
            expect(parse_dtype(v["input"]) == v["dtype"], f"dtype {v['input']!r}")
        else:
            expect(rejects(lambda: parse_dtype(v["input"])), f"dtype {v['input']!r} accepted")
    expect({v["input"] for v in vf["dtypes"] if "dtype" in v} >= set(DTYPES) | set(ALIASES), "dtypes: the table is not all in the vectors")
    print(f"dtypes: {len(vf['dtypes'])} ok")

    for v in vf["invalid_identities"]:
        expect(rejects(lambda: encode_identity(identity_from_json(v["identity"])), v["field"]),
               f"invalid identity {v['name']}: not rejected for {v['field']}")
    print(f"invalid identities: {len(vf['invalid_identities'])} rejected")
    for v in vf["invalid_encodings"]:
        expect(rejects(lambda: decode_identity(bytes.fromhex(v["encoding"]))), f"invalid encoding {v['name']}: decoded")
    print(f"invalid encodings: {len(vf['invalid_encodings'])} rejected")
    for v in vf["invalid_chains"]:
        expect(rejects(lambda: chain(v["block_size"], [], v["extras"]), v["field"]),
               f"invalid chain {v['name']}: not rejected for {v['field']}")
    print(f"invalid chains: {len(vf['invalid_chains'])} rejected")
    for v in vf["invalid_json"]:
        expect(rejects(lambda: identity_from_json(json.loads(v["json"])), "kind"), f"invalid JSON {v['name']}: decoded")
    print(f"invalid JSON identities: {len(vf['invalid_json'])} rejected")
    for v in vf["invalid_keys"]:
        expect(rejects(lambda: parse_key(v["key"])), f"invalid key {v['key']!r}: parsed")
    print(f"invalid keys: {len(vf['invalid_keys'])} rejected")

    w = {x["name"]: x["hex"] for x in vf["worked_example"]}
    img = H(b"img")
    ex_a = [{"kind": "cache_salt", "value": "s"}, {"kind": "multimodal", "hash": img.hex(), "offset": 6, "length": 3}]
    seed, steps, seed_msg = chain(4, list(range(1, 10)), ex_a)
    seed_b, steps_b, seed_msg_b = chain(129, list(range(129)), [])
    basic, basic_d = ids["basic"]
    _, steps_d, _ = chain(16, list(range(1, 17)), ex_a[:1])
    # E: basic with four layers in two groups; F: the key of block 0 of
    # its group 1, which spans two hash blocks.
    e = dict(basic, layers=4, groups=[
        {"kind": SLIDING, "layers": [0, 2], "block_size": 16, "window": 128, "state_bytes": 0},
        {"kind": FULL, "layers": [1, 3], "block_size": 32, "window": 0, "state_bytes": 0}])
    enc_e = encode_identity(e)
    d_e = H(enc_e)
    _, steps_f, _ = chain(16, list(range(1, 33)), ex_a[:1])
    got = {
        "E.encoding": enc_e, "E.digest": d_e,
        "F.block1_message": steps_f[1][2], "F.block1_hash": steps_f[1][3],
        "F.key": key("acme", d_e[:16].hex(), 1, 1, steps_f[(0 + 1) * (32 // 16) - 1][3].hex()).encode(),
        # G: layers [1, 2) of F's block (group 1 has 2 layers), and layers
        # [0, 1) of block 0 of group 0 (2 layers; block size 16, D's hash).
        "G.key": key("acme", d_e[:16].hex(), 1, 1, steps_f[(0 + 1) * (32 // 16) - 1][3].hex(), (1, 2), 2).encode(),
        "G.group0.key": key("acme", d_e[:16].hex(), 1, 0, steps_f[0][3].hex(), (0, 1), 2).encode(),
        "A.content_hash": img, "A.seed_message": seed_msg, "A.seed": seed, "A.block0_message": steps[0][2],
        "A.block0_hash": steps[0][3], "A.block1_extras_message": steps[1][0], "A.block1_extras_digest": H(steps[1][0]),
        "A.block1_message": steps[1][2], "A.block1_hash": steps[1][3],
        "B.seed_message": seed_msg_b, "B.seed": seed_b, "B.token_digest": steps_b[0][1], "B.block0_message": steps_b[0][2],
        "B.block0_hash": steps_b[0][3],
        "C.encoding": encode_identity(basic), "C.digest": basic_d,
        "D.block0_message": steps_d[0][2], "D.block0_hash": steps_d[0][3],
        "D.key": key("acme", basic_d[:16].hex(), 1, 0, steps_d[0][3].hex()).encode(),
    }
    expect(set(got) == set(w), f"worked example: names {sorted(w)}")
    for k, want in got.items():
        expect(w[k] == want.hex(), f"worked example {k}")
    print(f"worked example: {len(w)} ok")

    # Section 11: the fold of a block hash into vLLM's 64-bit block ids.
    chain_hashes = {h for v in vf["chains"] for h in v["hashes"]}
    for v in vf["folds"]:
        h = bytes.fromhex(v["hash"])
        expect(len(h) == 32, f"fold {v['hash']}: not 32 bytes")
        expect(int.from_bytes(h, "big") & (2**64 - 1) == v["uint64"], f"fold {v['hash']}: {v['uint64']}")
    expect(sum(v["hash"] in chain_hashes for v in vf["folds"]) >= 1, "folds: no hash of a chain")
    print(f"folds: {len(vf['folds'])} ok")


if __name__ == "__main__":
    main()
