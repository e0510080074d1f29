#!/usr/bin/env python3
"""flamegraph — turns `perf script` text output into a flame graph SVG (or folded stacks).

Reads the samples that `perf script` prints for a `perf record -g` profile: a header line
("comm pid [cpu] time: period event:") followed by one tab-indented line per frame
("addr symbol+off (dso)", leaf first), samples separated by blank lines. Each sample's stack is
folded root first, with +0x offsets stripped and unknown symbols shown as "[dso basename]" or
"[unknown]". Every sample counts 1 (the period is ignored).

The SVG is self-contained: one rectangle per frame, width proportional to its sample count,
stacked from the bottom, warm colours from a hash of the function name, a <title> tooltip
"name (N samples, P%)" and a label clipped to the rectangle's width. The heading shows the
title and the total sample count.

Usage:
  perf script -i perf.data | /usr/bin/python3 tools/flamegraph.py --title "worker-0" > out.svg
  /usr/bin/python3 tools/flamegraph.py --in perf.txt [--folded] [--comm] [--width 1200]
    --folded   print the folded stacks ("a;b;c N", sorted) instead of the SVG
    --comm     put the process name (comm) at the root of every stack

Empty input, or input without any call stack: one-line error on stderr, exit 2.
"""
import argparse
import colorsys
import hashlib
import os
import re
import signal
import sys
from collections import Counter
from xml.sax.saxutils import escape

HEADER_RE = re.compile(r"^\s*(\S.*?)\s+(\d+)(?:/\d+)?\s+(?:\[\d+\]\s+)?\d+\.\d+:")
OFFSET_RE = re.compile(r"\+0x[0-9a-fA-F]+$")
HEX_RE = re.compile(r"^[0-9a-fA-F]+$")

FRAME_H = 17
FONT_PX = 11
CHAR_W = FONT_PX * 0.61          # approximate advance of a monospace glyph
PAD = 10
HEAD_H = 52


def fail(msg):
    print(f"flamegraph: error: {msg}", file=sys.stderr)
    sys.exit(2)


def frame_name(line):
    """Function name of one perf script frame line."""
    text = line.strip()
    parts = text.split(None, 1)
    rest = parts[1] if len(parts) == 2 and HEX_RE.match(parts[0]) else text
    if HEX_RE.match(rest):                    # a bare address
        rest = ""
    sym, dso = rest, ""
    if rest.endswith(")"):                    # the last balanced "(...)" is the dso
        depth = 0
        for i in range(len(rest) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(rest[i], 0)
            if depth == 0:
                sym, dso = rest[:i].strip(), rest[i + 1:-1]
                break
    sym = OFFSET_RE.sub("", sym)
    if sym in ("", "[unknown]"):
        base = os.path.basename(dso.rstrip("/"))
        sym = f"[{base.strip('[]')}]" if dso and dso != "[unknown]" and base else "[unknown]"
    return sym.replace(";", ":")


def fold(lines, with_comm=False):
    """Counter of "root;...;leaf" -> samples, and the number of samples without a stack."""
    stacks = Counter()
    no_stack = 0
    comm, frames = None, []

    def finish():
        nonlocal no_stack
        if comm is None:
            return
        if frames:
            path = list(reversed(frames))
            if with_comm:
                path.insert(0, comm.replace(";", ":"))
            stacks[";".join(path)] += 1
        else:
            no_stack += 1

    for raw in lines:
        line = raw.rstrip("\r\n")
        if not line.strip():
            finish()
            comm, frames = None, []
        elif line.startswith("#"):
            continue
        elif line[0] == "\t" or (comm is not None and line[0] == " "
                                 and not HEADER_RE.match(line)):
            if comm is not None:
                frames.append(frame_name(line))
        else:                                  # a sample header (also without blank lines)
            finish()
            m = HEADER_RE.match(line)
            comm, frames = (m.group(1) if m else line.split()[0]), []
    finish()
    return stacks, no_stack


class Node:
    __slots__ = ("name", "count", "children")

    def __init__(self, name):
        self.name, self.count, self.children = name, 0, {}


def build_tree(stacks):
    root = Node("all")
    for path, n in stacks.items():
        root.count += n
        node = root
        for name in path.split(";"):
            node = node.children.setdefault(name, Node(name))
            node.count += n
    return root


def depth_of(node):
    return 1 + max((depth_of(c) for c in node.children.values()), default=0)


def colour(name):
    h = hashlib.md5(name.encode("utf-8", "replace")).digest()
    hue = (h[0] / 255.0) * 55.0 / 360.0           # red .. orange .. yellow
    light = 0.52 + (h[1] / 255.0) * 0.14
    sat = 0.75 + (h[2] / 255.0) * 0.2
    r, g, b = colorsys.hls_to_rgb(hue, light, sat)
    return f"rgb({int(r * 255)},{int(g * 255)},{int(b * 255)})"


def attr(text):
    return escape(text, {'"': "&quot;"})


def render_svg(root, title, width):
    total = root.count
    levels = depth_of(root)
    height = HEAD_H + levels * FRAME_H + PAD
    scale = (width - 2 * PAD) / total
    out = [
        '<?xml version="1.0" encoding="UTF-8" standalone="no"?>',
        f'<svg xmlns="http://www.w3.org/2000/svg" version="1.1" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}">',
        "<style>text { font-family: monospace; font-size: %dpx; fill: #000; } "
        ".head { font-size: 16px; } .sub { font-size: 12px; fill: #444; } "
        "rect { stroke: #fff; stroke-width: 0.5; } g:hover rect { stroke: #000; }"
        "</style>" % FONT_PX,
        f'<rect x="0" y="0" width="{width}" height="{height}" fill="#fdf6ea" '
        'style="stroke:none"/>',
        f'<text class="head" x="{width / 2:.1f}" y="22" text-anchor="middle">'
        f"{escape(title)}</text>",
        f'<text class="sub" x="{width / 2:.1f}" y="40" text-anchor="middle">'
        f"{total} samples</text>",
    ]

    def emit(node, x0, level):
        w = node.count * scale
        if w < 0.3:                      # narrower than a pixel fraction: skip with children
            return
        y = height - PAD - (level + 1) * FRAME_H
        pct = 100.0 * node.count / total
        tip = f"{node.name} ({node.count} samples, {pct:.2f}%)"
        out.append(f"<g><title>{escape(tip)}</title>"
                   f'<rect x="{x0:.2f}" y="{y}" width="{w:.2f}" height="{FRAME_H - 1}" '
                   f'fill="{colour(node.name)}" rx="2"/>')
        fit = int((w - 6) / CHAR_W)
        if fit >= 3:
            label = node.name if len(node.name) <= fit else node.name[:fit - 2] + ".."
            out.append(f'<text x="{x0 + 3:.2f}" y="{y + FRAME_H - 5}">{escape(label)}</text>')
        out.append("</g>")
        x = x0
        for child in sorted(node.children.values(), key=lambda c: c.name):
            emit(child, x, level + 1)
            x += child.count * scale

    emit(root, PAD, 0)
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser(description="Flame graph SVG from `perf script` output.")
    p.add_argument("--in", dest="infile", help="perf script output file (default: stdin)")
    p.add_argument("--title", default="Flame graph", help="heading of the SVG")
    p.add_argument("--folded", action="store_true", help="print folded stacks instead")
    p.add_argument("--comm", action="store_true", help="root every stack at its comm")
    p.add_argument("--width", type=int, default=1200, help="SVG width in px (default 1200)")
    a = p.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)    # quiet when piped into head
    if a.width < 100:
        fail("--width must be at least 100")
    if a.infile:
        try:
            with open(a.infile, encoding="utf-8", errors="replace") as f:
                lines = f.readlines()
        except OSError as e:
            fail(f"cannot read {a.infile}: {e}")
        source = a.infile
    else:
        lines = sys.stdin.buffer.read().decode("utf-8", "replace").splitlines()
        source = "stdin"
    if not any(line.strip() for line in lines):
        fail(f"empty input ({source}): expected `perf script` output")
    stacks, no_stack = fold(lines, a.comm)
    if not stacks:
        fail(f"no call stacks in {source} ({no_stack} samples without frames; "
             "record with `perf record -g` and pass `perf script` output)")
    if a.folded:
        sys.stdout.write("".join(f"{k} {v}\n" for k, v in sorted(stacks.items())))
    else:
        sys.stdout.write(render_svg(build_tree(stacks), a.title, a.width))


if __name__ == "__main__":
    main()
