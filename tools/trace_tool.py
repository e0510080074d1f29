#!/usr/bin/env python3
"""trace_tool — reads the Chrome trace JSON that the orochi coordinator writes.

The trace is {"traceEvents": [...], "otherData": {"seconds": S, "load_average": "..."}} with
"M" metadata events naming each process (coordinator, worker-N, speculator ids) and thread,
"X" complete events (ts/dur in microseconds from the trace start) and "b"/"e" async events
(the "queued" spans of requests waiting in the queue).

Subcommands:
  summary TRACE.json [--role NAME] [--json]
      Per process (or only NAME): for each event name the count, total/mean/p50/p90/max in ms and
      the share of the trace's wall time; "queued" async spans appear as "queued [async]". For
      worker "step" events also each phase arg (*_us) as mean µs and share of the step's mean
      dur, plus the phase-sum check (mean of sum(phases)/dur); for a speculator also its idle
      time (the wall time neither drafting nor applying a Feedback). Wall time is the larger of
      otherData.seconds and the span of the events. --json prints one JSON object instead.
  check TRACE.json [--expect-roles a,b,c]
      Validates: an object with a traceEvents list; ph and pid on every event and the fields
      each ph needs (X: name, ts, dur >= 0, tid); a process_name for every pid with events;
      otherData.events (when present) equal to the event count; with --expect-roles, each named
      process present with at least one X event. Prints "ok: N events, M processes (names)",
      or "problem: ..." and exits 1 (exit 2 only for an unreadable or non-JSON file).
  plot TRACE.json OUT.png [--window-ms 250] [--start-ms T]
      Timeline PNG: one lane per (process, thread), X events as bars coloured by name, nested
      events as thinner bars on their parent. Without --start-ms the window starts at the first
      coordinator "cycle" after 40% of the trace.

Unreadable file, invalid JSON or a wrong structure: one-line error on stderr, exit 2.
Usage: python3 tools/trace_tool.py {summary,check,plot} TRACE.json ...  (summary and check need
only the standard library; plot needs matplotlib)
"""
import argparse
import json
import sys
import signal
from collections import Counter, defaultdict



def fail(msg, code=2):
    print(f"trace_tool: error: {msg}", file=sys.stderr)
    sys.exit(code)


def is_num(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def load(path):
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        fail(f"cannot read {path}: {e}")
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{path} is not JSON: {e}")


def load_trace(path):
    """The Trace of a file that must be structurally valid (else exit 2)."""
    doc = load(path)
    problem = first_problem(doc)
    if problem:
        fail(f"{path}: {problem}")
    return Trace(doc)


def first_problem(doc):
    """Returns a description of the first structural problem, or None."""
    if not isinstance(doc, dict) or not isinstance(doc.get("traceEvents"), list):
        return "top level is not an object with a traceEvents list"
    for i, ev in enumerate(doc["traceEvents"]):
        where = f"event {i}"
        if not isinstance(ev, dict):
            return f"{where} is not an object"
        ph = ev.get("ph")
        if not isinstance(ph, str) or not isinstance(ev.get("pid"), int):
            return f"{where} lacks ph or an integer pid"
        where += f" (ph {ph}, name {ev.get('name')!r})"
        if ph == "X":
            if not isinstance(ev.get("name"), str):
                return f"{where} has no name"
            if not is_num(ev.get("ts")) or not is_num(ev.get("dur")):
                return f"{where} lacks a numeric ts or dur"
            if ev["dur"] < 0:
                return f"{where} has dur {ev['dur']} < 0"
            if not isinstance(ev.get("tid"), int):
                return f"{where} lacks an integer tid"
        elif ph == "M":
            if not isinstance(ev.get("name"), str):
                return f"{where} has no name"
            args = ev.get("args")
            if ev["name"] in ("process_name", "thread_name") and (
                    not isinstance(args, dict) or not isinstance(args.get("name"), str)):
                return f"{where} lacks args.name"
            if ev["name"] == "thread_name" and not isinstance(ev.get("tid"), int):
                return f"{where} lacks an integer tid"
        elif ph in ("b", "e"):
            if not isinstance(ev.get("name"), str) or "id" not in ev or not is_num(ev.get("ts")):
                return f"{where} lacks name, id or a numeric ts"
        elif not is_num(ev.get("ts")):
            return f"{where} lacks a numeric ts"
    return None


class Trace:
    def __init__(self, doc):
        other = doc.get("otherData") if isinstance(doc.get("otherData"), dict) else {}
        self.other = other
        self.seconds = other.get("seconds")
        self.load_average = other.get("load_average")
        self.proc = {}            # pid -> process name
        self.sort_index = {}      # pid -> process_sort_index, when given
        self.thread = {}          # (pid, tid) -> thread name
        self.xs = []              # X events
        self.asyncs = []          # (pid, name, start, end) from matched b/e pairs
        opened = {}
        for ev in doc["traceEvents"]:
            ph, pid = ev["ph"], ev["pid"]
            if ph == "M" and ev["name"] == "process_name":
                self.proc[pid] = ev["args"]["name"]
            elif ph == "M" and ev["name"] == "process_sort_index":
                idx = (ev.get("args") or {}).get("sort_index")
                if is_num(idx):
                    self.sort_index[pid] = idx
            elif ph == "M" and ev["name"] == "thread_name":
                self.thread[(pid, ev["tid"])] = ev["args"]["name"]
            elif ph == "X":
                self.xs.append(ev)
            elif ph == "b":
                opened[(pid, ev.get("cat"), ev["name"], str(ev["id"]))] = ev["ts"]
            elif ph == "e":
                ts0 = opened.pop((pid, ev.get("cat"), ev["name"], str(ev["id"])), None)
                if ts0 is not None:
                    self.asyncs.append((pid, ev["name"], ts0, ev["ts"]))
        starts = [e["ts"] for e in self.xs] + [a[2] for a in self.asyncs]
        ends = [e["ts"] + e["dur"] for e in self.xs] + [a[3] for a in self.asyncs]
        self.t0 = min(starts) if starts else 0.0
        self.t1 = max(ends) if ends else 0.0
        span = self.t1 - min(self.t0, 0.0)
        secs = self.seconds * 1e6 if is_num(self.seconds) else 0.0
        self.wall_us = max(span, secs)

    def name(self, pid):
        return self.proc.get(pid, f"pid {pid}")

    def label(self, pid):
        """The process name, with the pid when several processes share it (a respawn)."""
        n = self.name(pid)
        return f"{n} (pid {pid})" if list(self.proc.values()).count(n) > 1 else n

    def pids(self):
        """Pids with events: by process_sort_index, else coordinator, workers, the rest."""
        used = {e["pid"] for e in self.xs} | {a[0] for a in self.asyncs}

        def rank(pid):
            n = self.name(pid)
            role = 0 if n == "coordinator" else 1 if n.startswith("worker") else 2
            return (self.sort_index.get(pid, role), n, pid)
        return sorted(used, key=rank)


def percentile(sorted_vals, q):
    """The q-th percentile (0..100) by linear interpolation between closest ranks."""
    if len(sorted_vals) == 1:
        return sorted_vals[0]
    pos = (len(sorted_vals) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(sorted_vals) - 1)
    return sorted_vals[lo] + (sorted_vals[hi] - sorted_vals[lo]) * (pos - lo)


def stats_row(name, durs_us, wall_us):
    d = sorted(float(x) / 1000.0 for x in durs_us)
    total = sum(d)
    return {"name": name, "count": len(d), "total_ms": total,
            "mean_ms": total / len(d), "p50_ms": percentile(d, 50),
            "p90_ms": percentile(d, 90), "max_ms": d[-1],
            "pct_wall": 100.0 * total * 1000.0 / wall_us if wall_us > 0 else 0.0}


def phase_stats(steps):
    keys = []
    for ev in steps:
        for k in (ev.get("args") or {}):
            if k.endswith("_us") and k not in keys:
                keys.append(k)
    if not keys:
        return None
    vals = [[float((ev.get("args") or {}).get(k, 0) or 0) for k in keys] for ev in steps]
    durs = [float(ev["dur"]) for ev in steps]
    mean_dur = sum(durs) / len(durs)
    phases = []
    for i, k in enumerate(keys):
        mean = sum(v[i] for v in vals) / len(vals)
        phases.append({"phase": k, "mean_us": mean,
                       "share": mean / mean_dur if mean_dur > 0 else 0.0})
    ratios = [sum(v) / d for v, d in zip(vals, durs) if d > 0]
    ratio = sum(ratios) / len(ratios) if ratios else None
    return {"step_mean_us": float(mean_dur), "phases": phases, "phase_sum_over_dur": ratio}


def summarize(tr, role):
    pids = tr.pids()
    if role is not None:
        pids = [p for p in pids if tr.name(p) == role]
        if not pids:
            fail(f"no process named {role!r} (have: {', '.join(tr.name(p) for p in tr.pids())})")
    out = {"seconds": tr.seconds, "load_average": tr.load_average,
           "wall_ms": tr.wall_us / 1000.0, "processes": []}
    for pid in pids:
        by_name = defaultdict(list)
        for ev in tr.xs:
            if ev["pid"] == pid:
                by_name[ev["name"]].append(ev)
        rows = [stats_row(n, [e["dur"] for e in evs], tr.wall_us) for n, evs in by_name.items()]
        for n in sorted({a[1] for a in tr.asyncs if a[0] == pid}):
            durs = [a[3] - a[2] for a in tr.asyncs if a[0] == pid and a[1] == n]
            rows.append(stats_row(f"{n} [async]", durs, tr.wall_us))
        rows.sort(key=lambda r: -r["total_ms"])
        proc = {"pid": pid, "name": tr.name(pid), "events": rows}
        if tr.name(pid).startswith("worker") and by_name.get("step"):
            proc["step_phases"] = phase_stats(by_name["step"])
        elif tr.name(pid) != "coordinator" and tr.wall_us > 0:
            # a speculator: what is neither drafting nor applying a Feedback is idle time
            busy = sum(e["dur"] for n in ("draft", "feedback") for e in by_name.get(n, []))
            proc["idle_ms"] = max(0.0, (tr.wall_us - busy) / 1000.0)
            proc["idle_pct"] = 100.0 * proc["idle_ms"] * 1000.0 / tr.wall_us
        out["processes"].append(proc)
    return out


def print_summary(s):
    la = s["load_average"] if s["load_average"] is not None else "?"
    secs = s["seconds"] if s["seconds"] is not None else "?"
    print(f"trace: {secs} s (wall {s['wall_ms']:.1f} ms), load average {la}")
    for p in s["processes"]:
        print(f"\n== {p['name']} (pid {p['pid']})")
        print(f"  {'event':<18} {'count':>7} {'total ms':>10} {'mean ms':>9} {'p50':>9} "
              f"{'p90':>9} {'max ms':>9} {'% wall':>7}")
        for r in p["events"]:
            print(f"  {r['name'][:18]:<18} {r['count']:>7} {r['total_ms']:>10.2f} "
                  f"{r['mean_ms']:>9.3f} {r['p50_ms']:>9.3f} {r['p90_ms']:>9.3f} "
                  f"{r['max_ms']:>9.3f} {r['pct_wall']:>6.1f}%")
        if "idle_ms" in p:
            print(f"  {'idle':<18} {'':>7} {p['idle_ms']:>10.2f} {'':>9} {'':>9} {'':>9} {'':>9} "
                  f"{p['idle_pct']:>6.1f}%")
        ph = p.get("step_phases")
        if ph:
            print(f"  step phases (mean step {ph['step_mean_us']:.1f} us):")
            for q in ph["phases"]:
                print(f"    {q['phase']:<16} {q['mean_us']:>10.1f} us {100 * q['share']:>6.1f}%")
            r = ph["phase_sum_over_dur"]
            print("    phase-sum check: mean sum(phases)/dur = "
                  + (f"{r:.3f}" if r is not None else "n/a (all dur 0)"))


def cmd_summary(a):
    s = summarize(load_trace(a.trace), a.role)
    if a.json:
        print(json.dumps(s, indent=1))
    else:
        print_summary(s)


def cmd_check(a):
    doc = load(a.trace)
    problem = first_problem(doc)
    if problem is None:
        tr = Trace(doc)
        n = tr.other.get("events")          # the writer's own count, when it gives one
        if is_num(n) and n != len(doc["traceEvents"]):
            problem = f"otherData.events is {n} but the file has {len(doc['traceEvents'])}"
        unnamed = sorted({ev["pid"] for ev in doc["traceEvents"]} - set(tr.proc))
        if unnamed and problem is None:
            problem = f"pid {unnamed[0]} has events but no process_name"
    if problem is None and a.expect_roles:
        with_x = {tr.name(ev["pid"]) for ev in tr.xs}
        for role in (r.strip() for r in a.expect_roles.split(",") if r.strip()):
            if role not in tr.proc.values():
                problem = f"expected process {role!r} is missing"
            elif role not in with_x:
                problem = f"expected process {role!r} has no X events"
            if problem:
                break
    if problem:
        print(f"problem: {problem}")
        sys.exit(1)
    names = [tr.label(p) for p in sorted(tr.proc)]
    print(f"ok: {len(doc['traceEvents'])} events, {len(names)} processes ({', '.join(names)})")


def nest_depths(evs):
    """Depth of each event (sorted by ts) inside the enclosing events of its track."""
    depths, stack = [], []
    for ev in evs:
        while stack and stack[-1] <= ev["ts"]:
            stack.pop()
        end = ev["ts"] + ev["dur"]
        while stack and stack[-1] < end:     # overlapping but not nested: treat as a sibling
            stack.pop()
        depths.append(len(stack))
        stack.append(end)
    return depths


def cmd_plot(a):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    tr = load_trace(a.trace)
    if not tr.xs:
        fail(f"{a.trace}: no X events to plot")
    if a.window_ms <= 0:
        fail("--window-ms must be > 0")
    win = a.window_ms * 1000.0
    if a.start_ms is not None:
        start = a.start_ms * 1000.0
    else:
        t40 = tr.t0 + 0.4 * (tr.t1 - tr.t0)
        cycles = sorted(e["ts"] for e in tr.xs if e["name"] == "cycle" and e["ts"] >= t40
                        and tr.name(e["pid"]) == "coordinator")
        start = cycles[0] if cycles else t40
        start = max(tr.t0, min(start, tr.t1 - win))
    end = start + win
    def visible(e):
        return e["ts"] < end and e["ts"] + e["dur"] > start

    tracks = defaultdict(list)
    for ev in tr.xs:
        tracks[(ev["pid"], ev["tid"])].append(ev)
    threads_per_pid = Counter(pid for pid, _ in tracks)
    order = {pid: i for i, pid in enumerate(tr.pids())}
    lanes = [k for k in sorted(tracks, key=lambda k: (order[k[0]], k[1]))
             if any(visible(e) for e in tracks[k])]
    if not lanes:
        fail(f"no X events between {start / 1000:.1f} and {end / 1000:.1f} ms")
    names = sorted({e["name"] for k in lanes for e in tracks[k] if visible(e)})
    cmap = plt.get_cmap("tab20" if len(names) > 10 else "tab10")
    colour = {n: cmap(i % cmap.N) for i, n in enumerate(names)}

    fig, ax = plt.subplots(figsize=(16, 1.6 + 0.55 * len(lanes)))
    labels = []
    for y, (pid, tid) in enumerate(lanes):
        label = tr.label(pid)
        if threads_per_pid[pid] > 1:
            label += " / " + tr.thread.get((pid, tid), f"tid {tid}")
        labels.append(label)
        evs = sorted(tracks[(pid, tid)], key=lambda e: (e["ts"], -e["dur"]))
        groups = defaultdict(list)
        for ev, d in zip(evs, nest_depths(evs)):
            if visible(ev):
                groups[(d, ev["name"])].append((ev["ts"] / 1000.0, ev["dur"] / 1000.0))
        for (d, n), spans in sorted(groups.items()):
            h = 0.8 * 0.6 ** d
            edge = tuple(0.6 * c for c in colour[n][:3])   # darker rim separates neighbours
            ax.broken_barh(spans, (y - h / 2, h), facecolors=colour[n], edgecolors=edge,
                           linewidth=0.4, zorder=2 + d)
    ax.set_yticks(range(len(lanes)))
    ax.set_yticklabels(labels)
    ax.set_ylim(len(lanes) - 0.5, -0.5)
    ax.set_xlim(start / 1000.0, end / 1000.0)
    ax.set_xlabel("time since trace start (ms)")
    ax.grid(axis="x", alpha=0.3)
    la = tr.load_average if tr.load_average is not None else "?"
    ax.set_title(f"orochi trace: {start / 1000:.1f}-{end / 1000:.1f} ms "
                 f"(of {tr.wall_us / 1e6:.2f} s), load average {la}")
    ax.legend(handles=[Patch(color=colour[n], label=n) for n in names],
              loc="upper left", bbox_to_anchor=(1.005, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    try:
        fig.savefig(a.out, dpi=110)
    except OSError as e:
        fail(f"cannot write {a.out}: {e}")
    print(f"wrote {a.out}: {len(lanes)} lanes, {start / 1000:.1f}-{end / 1000:.1f} ms")


def main():
    p = argparse.ArgumentParser(description="Summarize, check or plot an orochi Chrome trace.")
    sub = p.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("summary", help="per-process event statistics")
    s.add_argument("trace", help="trace JSON written by the coordinator")
    s.add_argument("--role", help="only the process with this name (e.g. worker-0)")
    s.add_argument("--json", action="store_true", help="print one JSON object")
    s.set_defaults(fn=cmd_summary)
    c = sub.add_parser("check", help="validate the trace structure")
    c.add_argument("trace")
    c.add_argument("--expect-roles", help="comma-separated process names that must have events")
    c.set_defaults(fn=cmd_check)
    g = sub.add_parser("plot", help="timeline PNG of a window")
    g.add_argument("trace")
    g.add_argument("out")
    g.add_argument("--window-ms", type=float, default=250.0, help="window length (250)")
    g.add_argument("--start-ms", type=float, help="window start (default: first cycle after 40%%)")
    g.set_defaults(fn=cmd_plot)
    a = p.parse_args()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)    # quiet when piped into head
    a.fn(a)


if __name__ == "__main__":
    main()
