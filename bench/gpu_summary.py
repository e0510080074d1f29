#!/usr/bin/env python3
"""The GPU issue's rows from one deploy/gpu-check.sh run: its plans.jsonl (orochi bench --plans)
and, where the peer stage ran, peer.jsonl (llama-bench -o jsonl), as markdown tables.

    bench/gpu_summary.py PLANS.jsonl [PEER.jsonl]

1. Per model, the GPU alone with each matmul kind it ran on (the defaults otherwise: fragment
   order auto, one token group): the width-1 step and its weights' share of the copy bandwidth
   (the 8B shape asks 60%, the 1B shape 35%), the width-64 step over the width-1 step (asked: 2 at
   most), and a 2048-token prompt's share of the tensor cores (asked: 40%), each marked "met" or
   "short".
2. Where more than one ran, per model and width, each variant of the tensor-core matmul (fragment
   order, token groups): its step time, and the fastest per width marked.
3. The peer beside orochi per model file: llama-bench's tg128, pp64 and pp2048 tokens/s against
   orochi's 1000 / (width-1 ms), 64000 / (width-64 ms) and the prompt's tokens/s.

Where a configuration ran several times (the stages' rounds, or several stages), the fastest run
counts: every run is a median of its repetitions, and the rounds alternate the variants so that
none has the card warmer.
"""
import json
import os
import sys


def load(path):
    rows = []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line.startswith("{"):
                try:
                    rows.append(json.loads(line))
                except ValueError:
                    pass
    return rows


def best(table, key, value):
    """Keep the smallest value per key."""
    if value is not None and (key not in table or value < table[key]):
        table[key] = value


def target(model):
    return 0.35 if "1b" in model else 0.60


def pct(v):
    return "-" if v is None else "%.1f%%" % (100 * v)


def ms(v):
    return "-" if v is None else "%.2f" % v


def mark(ok):
    return "" if ok is None else (" met" if ok else " short")


def main():
    if len(sys.argv) < 2:
        sys.exit("usage: gpu_summary.py PLANS.jsonl [PEER.jsonl]")
    rows = load(sys.argv[1])
    gpu = [r for r in rows if r.get("devices") == "gpu" and r.get("parts") == 1]
    steps, roof, prompt, variants = {}, {}, {}, {}
    for r in gpu:
        m = r["model"]
        default = r.get("gpu_frag_ask", "auto") == "auto" and r.get("gpu_groups_ask", 0) == 0 and \
            r.get("gpu_depth_ask", 0) == 0 and not r.get("gpu_early", False)
        if r["bench"] == "plans":
            kind = r.get("gpu_matmul", "cuda")
            if default and r.get("gpu_fuse", True) and r.get("gpu_unroll_ask", 0) == 0 and \
                    r.get("gpu_att_ask", 0) == 0 and r.get("gpu_memory") == "mirror" and r.get("gpu_graphs"):
                best(steps, (m, kind, r["width"]), r["ms"])
                if r["width"] == 1 and r.get("roofline"):
                    # the roofline of the fastest width-1 run
                    if steps[(m, kind, 1)] == r["ms"]:
                        roof[(m, kind)] = r["roofline"]
            if kind == "tensor":
                best(variants, (m, r["width"], "frag %s, groups %s, depth %s%s" % (
                    r.get("gpu_frag_ask", "auto"), r.get("gpu_groups_ask", 0) or "auto",
                    r.get("gpu_depth_ask", 0) or "auto", ", early" if r.get("gpu_early") else "")),
                     r["ms"])
        elif r["bench"] == "plans_prompt" and r.get("prompt") == 2048 and default:
            key = (m, r.get("gpu_matmul_ask", "auto"))
            if key not in prompt or r["ms"] < prompt[key]["ms"]:
                prompt[key] = r
    models = sorted({k[0] for k in steps})
    print("## The issue's rows (GPU alone, mirror, graphs on, defaults; the fastest run)\n")
    print("| model | matmul | W=1 ms | W=1 of copy bandwidth | W=64 ms | W=64 / W=1 | "
          "prompt 2048 ms | prompt of the tensor cores |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    for m in models:
        for kind in ("tensor", "cuda"):
            w1, w64 = steps.get((m, kind, 1)), steps.get((m, kind, 64))
            if w1 is None and w64 is None:
                continue
            share = roof.get((m, kind))
            ratio = w64 / w1 if w1 and w64 else None
            # the prompt asked for this kind, or for the default, which is tensor cores for the
            # quantized types
            asks = ("auto", "tensor") if kind == "tensor" else ("cuda",)
            p = next((prompt[(m, a)] for a in asks if (m, a) in prompt), None)
            print("| %s | %s | %s | %s%s | %s | %s%s | %s | %s%s |" % (
                m, kind, ms(w1), pct(share), mark(None if share is None else share >= target(m)),
                ms(w64), "-" if ratio is None else "%.2f" % ratio, mark(None if ratio is None else ratio <= 2),
                ms(p["ms"]) if p else "-", pct(p.get("tc_share")) if p and p.get("tc_share") else "-",
                mark(p["tc_share"] >= 0.40) if p and p.get("tc_share") else ""))
    names = sorted({k[2] for k in variants})
    if len(names) > 1:
        print("\n## The tensor-core matmul's variants (ms a step; * the fastest at its width)\n")
        print("| model | W | " + " | ".join(names) + " |")
        print("| --- | ---: |" + " ---: |" * len(names))
        for m in sorted({k[0] for k in variants}):
            for w in sorted({k[1] for k in variants if k[0] == m}):
                vals = [variants.get((m, w, n)) for n in names]
                low = min(v for v in vals if v is not None)
                print("| %s | %d | %s |" % (m, w, " | ".join(
                    "-" if v is None else "%.2f%s" % (v, "*" if v == low else "") for v in vals)))
    if len(sys.argv) > 2 and os.path.exists(sys.argv[2]):
        peer = {}
        for r in load(sys.argv[2]):
            if not r.get("gpu_info"):
                continue  # not on a GPU
            test = "tg%d" % r["n_gen"] if r.get("n_gen") else "pp%d" % r["n_prompt"]
            best(peer, (os.path.basename(r["model_filename"]), test), -r["avg_ts"])
        print("\n## The peer beside orochi (tokens/s; the best run of each)\n")
        print("| model | llama-bench tg128 | orochi W=1 | llama-bench pp64 | orochi W=64 | "
              "llama-bench pp2048 | orochi prompt 2048 |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: |")
        for m in sorted({k[0] for k in peer}):
            def rate(test):
                v = peer.get((m, test))
                return "-" if v is None else "%.1f" % -v
            w1, w64 = steps.get((m, "tensor", 1)), steps.get((m, "tensor", 64))
            p = prompt.get((m, "auto"))
            print("| %s | %s | %s | %s | %s | %s | %s |" % (
                m, rate("tg128"), "-" if not w1 else "%.1f" % (1000 / w1), rate("pp64"),
                "-" if not w64 else "%.1f" % (64000 / w64), rate("pp2048"),
                "-" if not p else "%.1f" % p["tok_s"]))


if __name__ == "__main__":
    main()
