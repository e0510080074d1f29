#!/usr/bin/env python3
"""check_layers.py — the floors of docs/architecture.md, read from the code's own includes.

Every `#include "FOLDER/..."` of a C/C++/CUDA source under the project's folders must point at a
folder on a lower floor, or at its own folder; the only sideways include allowed is bench/ ->
cli/ (the benchmarks are linked into the CLI). A role folder (workers/, coordinator/) never
includes another. Prints each offending include with its file and line and exits 1; exits 0 with
a one-line summary otherwise.
"""
import os
import re
import sys

ROOT = os.environ.get("OROCHI_SOURCE") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLOORS = {"base": 0, "kernels": 1, "shm": 1, "model": 2, "policy": 2, "group": 3,
          "workers": 4, "coordinator": 4, "cli": 4, "bench": 4}
SIDEWAYS = {("bench", "cli")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"/]+)/[^"]+"')


def main():
    bad, seen = [], 0
    for folder in FLOORS:
        for dirpath, _, files in os.walk(os.path.join(ROOT, folder)):
            for name in files:
                if not name.endswith((".c", ".h", ".cu", ".cuh", ".cc")):
                    continue
                path = os.path.join(dirpath, name)
                with open(path, errors="replace") as f:
                    for line_no, line in enumerate(f, 1):
                        m = INCLUDE.match(line)
                        if not m or m.group(1) not in FLOORS:
                            continue
                        seen += 1
                        to = m.group(1)
                        if to == folder or FLOORS[to] < FLOORS[folder] or (folder, to) in SIDEWAYS:
                            continue
                        bad.append("%s:%d: %s (floor %d) includes %s (floor %d)" % (
                            os.path.relpath(path, ROOT), line_no, folder, FLOORS[folder], to,
                            FLOORS[to]))
    for b in bad:
        print(b)
    print("check_layers: %d includes between the project's folders, %d running up or sideways" % (
        seen, len(bad)))
    return 1 if bad or not seen else 0


if __name__ == "__main__":
    sys.exit(main())
