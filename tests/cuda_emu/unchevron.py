#!/usr/bin/env python3
"""tests/cuda_emu/unchevron.py IN.cu OUT.cc — a CUDA source as C++ for the CPU emulation (kemu.h).

Each kernel launch `kernel<<<grid, block[, shared[, stream]]>>>(args)` becomes
`kemu_launch(kemu_cfg(grid, block[, shared[, stream]]), kernel, args)`; nothing else changes, and a
#line directive keeps compiler messages on the original file's lines.
"""
import re
import sys

LAUNCH = re.compile(r"(\b[A-Za-z_]\w*(?:\s*<[^<>;(){}]*>)?)\s*<<<(.*?)>>>\s*\((\s*\))?", re.S)


def rewrite(m):
    kernel, cfg, empty = m.group(1), m.group(2), m.group(3)
    return "kemu_launch(kemu_cfg(%s), %s%s" % (cfg, kernel, ")" if empty else ", ")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: unchevron.py IN.cu OUT.cc")
    src = open(sys.argv[1]).read()
    out, n = LAUNCH.subn(rewrite, src)
    if "<<<" in out:
        sys.exit("unchevron.py: %s: a launch it cannot read is left" % sys.argv[1])
    with open(sys.argv[2], "w") as f:
        f.write('#line 1 "%s"\n' % sys.argv[1])
        f.write(out)
    print("unchevron.py: %s: %d launches" % (sys.argv[1], n))


if __name__ == "__main__":
    main()
