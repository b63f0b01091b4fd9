#!/usr/bin/python3
"""tests/report/read_events.py — an independent reader of TensorBoard event files, written from the TFRecord
and protobuf specifications (not from dew's writer): CRC-32C by the bitwise definition, the protobuf wire
format field by field, Event / Summary / Summary.Value / Summary.Image / TensorProto by their field numbers
in tensorboard/compat/proto/*.proto.

  read_events.py check RUN_DIR      the run's tb/ holds one event file whose records all have valid CRCs,
                                    whose steps never go backwards, and whose scalars are exactly those of
                                    metrics.jsonl (every value at its step, as float32; nothing more), whose
                                    images and texts are the files of samples/ at their steps, and whose
                                    last "config" text is config.ini. Prints a summary line.
  read_events.py prefix FILE STEP   the byte length of the file's leading records of steps <= STEP.
"""
import json
import math
import os
import struct
import sys


def crc32c(data):
    crc = 0xFFFFFFFF
    for b in data:
        crc ^= b
        for _ in range(8):
            crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
    return crc ^ 0xFFFFFFFF


def masked(crc):
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283  # the check value of CRC-32C


def records(path):
    """(offset, end, payload) of every record; fails on a bad CRC or a torn record."""
    with open(path, "rb") as f:
        data = f.read()
    pos = 0
    while pos < len(data):
        if len(data) - pos < 12:
            raise SystemExit(f"{path}: torn record header at byte {pos}")
        (length,) = struct.unpack_from("<Q", data, pos)
        (len_crc,) = struct.unpack_from("<I", data, pos + 8)
        if len_crc != masked(crc32c(data[pos:pos + 8])):
            raise SystemExit(f"{path}: bad length CRC at byte {pos}")
        body = data[pos + 12:pos + 12 + length]
        if len(body) != length or len(data) < pos + 16 + length:
            raise SystemExit(f"{path}: torn record at byte {pos}")
        (body_crc,) = struct.unpack_from("<I", data, pos + 12 + length)
        if body_crc != masked(crc32c(body)):
            raise SystemExit(f"{path}: bad data CRC at byte {pos}")
        yield pos, pos + 16 + length, body
        pos += 16 + length


def fields(buf):
    """Protobuf wire format: a list of (field number, value); varints as int, fixed64/fixed32 as bytes."""
    out, pos = [], 0

    def varint():
        nonlocal pos
        v, shift = 0, 0
        while True:
            b = buf[pos]
            pos += 1
            v |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return v

    while pos < len(buf):
        key = varint()
        field, wire = key >> 3, key & 7
        if wire == 0:
            out.append((field, varint()))
        elif wire == 1:
            out.append((field, buf[pos:pos + 8]))
            pos += 8
        elif wire == 5:
            out.append((field, buf[pos:pos + 4]))
            pos += 4
        elif wire == 2:
            n = varint()
            out.append((field, buf[pos:pos + n]))
            pos += n
        else:
            raise SystemExit(f"unexpected wire type {wire}")
    if pos != len(buf):
        raise SystemExit("message overruns its length")
    return out


def first(fs, number, default=None):
    for f, v in fs:
        if f == number:
            return v
    return default


def parse_event(body):
    fs = fields(body)
    event = {"wall_time": struct.unpack("<d", first(fs, 1, b"\0" * 8))[0], "step": first(fs, 2, 0),
             "file_version": first(fs, 3), "values": []}
    summary = first(fs, 5)
    if summary is not None:
        for f, v in fields(summary):
            if f != 1:
                continue
            vf = fields(v)
            value = {"tag": first(vf, 1).decode()}
            if first(vf, 2) is not None:  # simple_value (float)
                value["scalar"] = struct.unpack("<f", first(vf, 2))[0]
            if first(vf, 4) is not None:  # Summary.Image
                im = fields(first(vf, 4))
                value["image"] = {"height": first(im, 1), "width": first(im, 2), "colorspace": first(im, 3),
                                  "png": first(im, 4)}
            if first(vf, 8) is not None:  # TensorProto
                t = fields(first(vf, 8))
                meta = fields(first(vf, 9, b""))
                plugin = fields(first(meta, 1, b""))
                value["text"] = {"dtype": first(t, 1), "plugin": (first(plugin, 1) or b"").decode(),
                                 "rank": len([d for d, _ in fields(first(t, 2, b"")) if d == 2]),
                                 "strings": [v for f2, v in t if f2 == 8]}
            event["values"].append(value)
    return event


def metrics_lines(path):
    def constant(name):
        return {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}[name]
    with open(path) as f:
        return [json.loads(line, parse_constant=constant) for line in f if line.strip()]


def f32(x):
    return struct.unpack("<f", struct.pack("<f", x))[0]


def same(a, b):
    return (math.isnan(a) and math.isnan(b)) or a == b


def dedent(markdown):
    lines = markdown.split("\n")
    assert all(l.startswith("    ") or l == "" for l in lines), "text is not an indented code block"
    return "\n".join(l[4:] for l in lines)


def tag_of(name):
    stem = name.rsplit(".", 1)[0]
    stem = stem.rstrip("0123456789").rstrip("-_")
    if stem.endswith("step"):
        stem = stem[:-4].rstrip("-_")
    return stem or "sample"


def check(run_dir):
    tb = os.path.join(run_dir, "tb")
    files = sorted(f for f in os.listdir(tb) if f.startswith("events.out.tfevents."))
    if len(files) != 1:
        raise SystemExit(f"expected one event file in {tb}, found {files}")
    events = [parse_event(body) for _, _, body in records(os.path.join(tb, files[0]))]
    if not events or events[0]["file_version"] != b"brain.Event:2":
        raise SystemExit("the first record is not file_version brain.Event:2")
    steps = [e["step"] for e in events]
    if steps != sorted(steps):
        raise SystemExit(f"steps go backwards: {steps}")

    # scalars: the multiset of (step, tag, float32 value) equals metrics.jsonl's
    want = []
    for row in metrics_lines(os.path.join(run_dir, "metrics.jsonl")):
        want += [(row["step"], k, f32(float(v))) for k, v in row.items()
                 if k != "step" and isinstance(v, (int, float)) and not isinstance(v, bool)]
    got = [(e["step"], v["tag"], v["scalar"]) for e in events for v in e["values"] if "scalar" in v]
    remaining = list(got)
    for step, tag, value in want:
        hit = next((i for i, (s, t, x) in enumerate(remaining) if s == step and t == tag and same(x, value)), None)
        if hit is None:
            near = [g for g in got if g[0] == step and g[1] == tag]
            raise SystemExit(f"metrics.jsonl {tag} = {value!r} at step {step} is not in the event file (there: {near})")
        del remaining[hit]
    if remaining:
        raise SystemExit(f"{len(remaining)} scalars in the event file are not in metrics.jsonl, e.g. {remaining[:3]}")

    # images and texts: the files of samples/ at their steps
    images = {(e["step"], v["tag"]): v["image"] for e in events for v in e["values"] if "image" in v}
    texts = {}
    for e in events:
        for v in e["values"]:
            if "text" in v:
                t = v["text"]
                if t["dtype"] != 7 or t["plugin"] != "text" or t["rank"] != 0 or len(t["strings"]) != 1:
                    raise SystemExit(f"text {v['tag']}: not a text-plugin rank-0 DT_STRING tensor: {t}")
                texts[(e["step"], v["tag"])] = dedent(t["strings"][0].decode("utf-8", "replace"))
    samples = os.path.join(run_dir, "samples")
    n_images = n_texts = 0
    for name in sorted(os.listdir(samples)) if os.path.isdir(samples) else []:
        stem = name.rsplit(".", 1)[0]
        step = int(stem[len(stem.rstrip("0123456789")):])
        key = (step, "val/" + tag_of(name))
        with open(os.path.join(samples, name), "rb") as f:
            content = f.read()
        if name.endswith(".png"):
            im = images.get(key)
            if im is None or im["png"] != content:
                raise SystemExit(f"samples/{name} is not the image {key} of the event file")
            w, h = struct.unpack(">II", content[16:24])
            if (im["width"], im["height"]) != (w, h) or im["colorspace"] not in (1, 2, 3, 4):
                raise SystemExit(f"image {key}: size {im['width']}x{im['height']} (file {w}x{h}), "
                                 f"colorspace {im['colorspace']}")
            n_images += 1
        elif name.endswith(".txt"):
            if texts.get(key) != content.decode("utf-8", "replace"):
                raise SystemExit(f"samples/{name} is not the text {key} of the event file: {texts.get(key)!r}")
            n_texts += 1
    configs = [texts[k] for k in sorted(texts) if k[1] == "config"]
    with open(os.path.join(run_dir, "config.ini")) as f:
        ini = "".join(l for l in f if not l.startswith("#"))
    if not configs or configs[-1] != ini:
        raise SystemExit("the last config text is not config.ini")
    print(f"{files[0]}: {len(events)} records, CRCs valid; {len(want)} scalars of metrics.jsonl at their steps "
          f"({len(set(s for s, _, _ in want))} steps), {n_images} images, {n_texts} texts, config")


def prefix(path, step):
    end = 0
    for _, stop, body in records(path):
        if parse_event(body)["step"] > step:
            break
        end = stop
    print(end)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "check":
        check(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "prefix":
        prefix(sys.argv[2], int(sys.argv[3]))
    else:
        raise SystemExit(__doc__)
