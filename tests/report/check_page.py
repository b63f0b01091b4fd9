#!/usr/bin/python3
"""tests/report/check_page.py — checks of a `dew-run report` page, independent of dew's code.

  check_page.py html REPORT RUN_DIR...   the page is self-contained (no http(s) address but the SVG
      namespace, no external script, style, image or font) and its embedded data is the runs': every value
      of each metrics.jsonl at its step, the newest PNG and text of samples/ per tag (bytes equal), config.ini.
  check_page.py render DOM SHOT [--min-plots N] [--title T ...]   after headless Chromium ran the page:
      the DOM (--dump-dom) says it rendered with no script error and where its plots are; in the
      screenshot (decoded here: zlib + PNG filters) every plot fully on screen has curve pixels (saturated
      colour) on a mostly white background, at least N plots were seen, and the charts titled T exist.
"""
import base64
import html.parser
import json
import math
import os
import re
import struct
import sys
import zlib


def fail(msg):
    raise SystemExit("FAIL: " + msg)


# ---- html: self-contained, and the data is the runs' ----
def embedded_data(page):
    m = re.search(r'<script type="application/json" id="dew-data">(.*?)</script>', page, re.S)
    if not m:
        fail("no <script id=dew-data> in the page")
    return json.loads(m.group(1))


def tag_of(name):
    stem = name.rsplit(".", 1)[0].rstrip("0123456789").rstrip("-_")
    if stem.endswith("step"):
        stem = stem[:-4].rstrip("-_")
    return stem or "sample"


def step_of(name):
    stem = name.rsplit(".", 1)[0]
    digits = stem[len(stem.rstrip("0123456789")):]
    return int(digits) if digits else -1


def check_html(path, run_dirs):
    page = open(path, encoding="utf-8").read()
    urls = set(re.findall(r"https?://[^\s\"'<>)]*", page))
    if urls - {"http://www.w3.org/2000/svg"}:
        fail(f"the page refers to the network: {sorted(urls)}")
    for pattern in (r"<script[^>]*\bsrc=", r"<link\b", r"@import", r"url\(\s*['\"]?(?!data:|#)", r"<img[^>]*src=\"(?!data:)"):
        if re.search(pattern, page, re.I):
            fail(f"the page loads another file ({pattern})")
    data = embedded_data(page)
    if len(data["runs"]) != len(run_dirs):
        fail(f"{len(data['runs'])} runs in the page, {len(run_dirs)} asked")
    for run, d in zip(data["runs"], run_dirs):
        if run["config_ini"] != open(os.path.join(d, "config.ini")).read():
            fail(f"{d}: config.ini differs")
        want = {}
        constant = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}
        for line in open(os.path.join(d, "metrics.jsonl")):
            row = json.loads(line, parse_constant=constant.__getitem__)
            for k, v in row.items():
                if k != "step":
                    want.setdefault(k, []).append([row["step"], v if math.isfinite(v) else None])
        if run["series"] != want:
            fail(f"{d}: the series differ from metrics.jsonl ({sorted(run['series'])} vs {sorted(want)})")
        samples = os.path.join(d, "samples")
        names = sorted(os.listdir(samples)) if os.path.isdir(samples) else []
        for ext, key in ((".png", "images"), (".txt", "texts")):
            newest = {}
            for n in names:
                if n.endswith(ext) and step_of(n) >= step_of(newest.get(tag_of(n), "x")):
                    newest[tag_of(n)] = n
            shown = {}
            for item in run[key]:
                shown.setdefault(item["tag"], item)  # the first of a tag is the newest
            if set(shown) != set(newest):
                fail(f"{d}: {key} tags {sorted(shown)} vs samples/ {sorted(newest)}")
            for tag, n in newest.items():
                raw = open(os.path.join(samples, n), "rb").read()
                item = shown[tag]
                b64 = item["src"].split(",", 1)[1] if key == "images" else item["base64"]
                if item["file"] != n or base64.b64decode(b64) != raw:
                    fail(f"{d}: the page's {tag} is not samples/{n}")
    print(f"{path}: self-contained; {len(run_dirs)} run(s): metrics, samples and config as in the run directories")


# ---- render: the DOM after the scripts ran, and the screenshot ----
class BodyAttrs(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.body, self.errors_hidden, self.errors_text, self._in_errors = {}, None, "", False
        self.titles = []
        self._in_title = False

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "body":
            self.body = a
        if a.get("id") == "dew-errors":
            self.errors_hidden = "hidden" in a
            self._in_errors = True
        if tag == "div" and "data-chart" in a:
            self.titles.append(a["data-chart"])

    def handle_endtag(self, tag):
        if tag == "pre":
            self._in_errors = False

    def handle_data(self, text):
        if self._in_errors:
            self.errors_text += text


def read_png(path):
    """(width, height, rows of RGB tuples) of an 8-bit RGB or RGBA, non-interlaced PNG."""
    data = open(path, "rb").read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        fail(f"{path} is not a PNG")
    pos, idat, ihdr = 8, b"", None
    while pos < len(data):
        (n,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            ihdr = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    w, h, depth, color, _, _, interlace = ihdr
    if depth != 8 or color not in (2, 6) or interlace:
        fail(f"{path}: unsupported PNG (depth {depth}, colour type {color}, interlace {interlace})")
    bpp = 3 if color == 2 else 4
    raw = zlib.decompress(idat)
    stride = w * bpp
    prev = bytearray(stride)
    rows = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
            elif f != 0:
                fail(f"{path}: bad filter {f}")
        rows.append(bytes(line))
        prev = line
    return w, h, bpp, rows


def check_render(dom_path, shot_path, min_plots, titles):
    p = BodyAttrs()
    p.feed(open(dom_path, encoding="utf-8").read())
    if p.body.get("data-errors") or p.errors_text.strip() or p.errors_hidden is False:
        fail(f"script errors: {p.errors_text.strip() or p.body.get('data-errors')}")
    if "data-rendered" not in p.body:
        fail("the page's script did not finish (no data-rendered on <body>)")
    plots = json.loads(p.body["data-plots"])
    if int(p.body["data-rendered"]) != len(plots) or not plots:
        fail(f"data-rendered {p.body['data-rendered']} but {len(plots)} plots")
    for t in titles:
        if t not in p.titles:
            fail(f"no chart titled {t!r} (charts: {p.titles})")
    w, h, bpp, rows = read_png(shot_path)

    def pixel(x, y):
        r = rows[y]
        return r[x * bpp], r[x * bpp + 1], r[x * bpp + 2]

    if pixel(4, 4) != (255, 255, 255):
        fail(f"the page background at (4, 4) is {pixel(4, 4)}, not white")
    seen = 0
    for plot in plots:
        x0, y0, pw, ph = plot["x"] + 2, plot["y"] + 2, plot["w"] - 4, plot["h"] - 4
        if x0 < 0 or y0 < 0 or x0 + pw > w or y0 + ph > h:
            continue  # below the screenshot
        ink = white = 0
        for y in range(y0, y0 + ph):
            for x in range(x0, x0 + pw):
                r, g, b = pixel(x, y)
                if max(r, g, b) - min(r, g, b) > 60:
                    ink += 1
                elif min(r, g, b) > 245:
                    white += 1
        area = pw * ph
        if ink < 60 or white < area // 2:
            fail(f"plot {plot['title']!r} at {plot['x']},{plot['y']} {plot['w']}x{plot['h']}: {ink} curve pixels, "
                 f"{white} white of {area}")
        seen += 1
    if seen < min_plots:
        fail(f"only {seen} plots on screen (of {len(plots)}), expected >= {min_plots}")
    print(f"{shot_path}: {seen} of {len(plots)} plots on screen, each with its curves; no script error")


if __name__ == "__main__":
    a = sys.argv[1:]
    if len(a) >= 3 and a[0] == "html":
        check_html(a[1], a[2:])
    elif len(a) >= 3 and a[0] == "render":
        min_plots, titles, rest = 1, [], a[3:]
        while rest:
            if rest[0] == "--min-plots":
                min_plots = int(rest[1])
            elif rest[0] == "--title":
                titles.append(rest[1])
            else:
                raise SystemExit(__doc__)
            rest = rest[2:]
        check_render(a[1], a[2], min_plots, titles)
    else:
        raise SystemExit(__doc__)
