"""The losslessness checks of a group with a GPU worker, shared by the tests whose GPU worker is the
CUDA emulation (test_gpu_emu_group.py) and a real GPU (test_gpu_device_group.py).

A GPU worker's numbers are not the CPU's bits, so what must hold is losslessness within each group,
token for token: the same group's answer with a speculator equals its answer without one. Each
function takes the model, the prompts and the answer length, runs its groups and returns what it
measured (for the caller's log); `flat_plan()` gives prompt lookup a step-time curve that makes it
draft; `tiny()`, PROMPTS and N are the small case both tests run.
"""
import os
import time

import group as G


# the tiny model's answers fall into loops that prompt lookup drafts from
PROMPTS = ["one two three four five six seven", "the cat sat on the mat and the cat sat on the mat and the"]
N = 120


def tiny():
    """The tiny Q4_1 model both GPU group tests run (two KV heads: one for each of two workers)."""
    return G.mkmodel(layers=4, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=512, type="q4_1",
                     seed=11)


def flat_plan():
    """A plan whose step-time curve is flat (as a GPU's is at these widths): prompt lookup then
    drafts, so that trees are verified. (An emulated GPU's steps cost in proportion to their width,
    and its coordinator would rightly decline to draft.)"""
    return G.write_plan(os.path.join(G.env()["tmp"], "gpu-flat-plan.json"), [1.0, 1.01, 1.02, 1.04, 1.08])


def agreement(got, want):
    """How far two answers agree: their common prefix and the count of equal positions."""
    common = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want)))
    same = sum(a == b for a, b in zip(got, want))
    return "common prefix %d of %d, %d tokens equal" % (common, len(want), same)


def timed(g, prompt, n):
    """One completion and its wall time in seconds (prefill, decode and HTTP together)."""
    t0 = time.monotonic()
    r = g.complete(prompt, n, timeout=600)
    return r, time.monotonic() - t0


def lookup_equals_plain(name, model, devices, mode, prompts, n, plain=None, extra=()):
    """The group `devices` (GPU memory `mode`) answers each prompt with the ngram speculator exactly
    as without it (its plain answers are computed first unless given). Returns (plain answers,
    mean accepted per prompt, the speculating group's worker logs); logs tokens/s of both."""
    args = ["--gpu-memory", mode] + list(extra)
    if plain is None:
        plain = {}
        with G.Group(name, model, devices=devices, extra=args) as g:
            for p in prompts:
                r, s = timed(g, p, n)
                plain[p] = r["orochi"]["token_ids"]
                G.log("  %s (%s), prompt %r: %d tokens in %.2f s plain" % (devices, mode, p[:30], len(plain[p]), s))
    accepted = []
    with G.Group(name + "-lookup", model, devices=devices, speculators=["ngram"],
                 extra=args + ["--plan", flat_plan()]) as g:
        for p in prompts:
            r, s = timed(g, p, n)
            G.check_eq(r["orochi"]["token_ids"], plain[p], "%s (%s) with ngram, prompt %r" % (devices, mode, p))
            accepted.append(r["orochi"]["mean_accepted"])
            G.log("  %s (%s) with ngram, prompt %r: %.2f s, mean accepted %.2f" % (devices, mode, p[:30], s,
                                                                                  accepted[-1]))
        g.down()  # a GPU worker says how many steps it replayed from graphs when it stops
        logs = [g.log("worker-%d" % i) for i in range(len(devices.split(",")))]
    return plain, accepted, logs


def cut_is_lossless(name, model, prompts, n, plain):
    """cpu:1,gpu:1 (mirror) with the GPU's attention cutting every key stream into 3 parts
    (--gpu-att-parts 3) answers each prompt with the ngram speculator exactly as without it, and
    its GPU worker says it cuts; logs how far its answers follow the uncut group's (`plain`: the
    same within rounding, so a near tie may differ)."""
    cut, _, logs = lookup_equals_plain(name, model, "cpu:1,gpu:1", "mirror", prompts, n,
                                       extra=["--gpu-att-parts", "3"])
    G.check("attention parts 3" in logs[1], "the GPU worker's log does not say it cuts attention:\n%s",
            logs[1][-1500:])
    for p in prompts:
        G.log("  attention cut in 3 against uncut, prompt %r: %s" % (p, agreement(cut[p], plain[p])))


def replayed(wlog):
    """The GPU worker's last 'steps replayed from' line, or None."""
    lines = [x for x in wlog.splitlines() if "steps replayed from" in x]
    return lines[-1].split("worker-")[-1] if lines else None


def check_replayed(wlog):
    """The GPU worker replayed at least one step from a CUDA graph; logs its count."""
    line = replayed(wlog)
    G.check(line and not line.split("GPU: ")[1].startswith("0 steps"), "the GPU worker replayed no step:\n%s",
            wlog[-1500:])
    G.log("  worker-%s" % line)


def unfused_equals(name, model, prompts, n, plain):
    """cpu:1,gpu:1 (mirror) with one launch per op (--gpu-fuse off) answers each prompt exactly as
    the fused group did (`plain`), and its GPU worker says it ran unfused."""
    with G.Group(name, model, devices="cpu:1,gpu:1", extra=["--gpu-memory", "mirror", "--gpu-fuse", "off"]) as g:
        for p in prompts:
            G.check_eq(g.ids(p, n), plain[p], "cpu:1,gpu:1 one launch per op against fused, prompt %r" % p)
        wlog = g.log("worker-1")
    G.check("launches one per op" in wlog, "the GPU worker's log does not say it runs unfused:\n%s", wlog[-1500:])
