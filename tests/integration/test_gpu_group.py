"""A group with a GPU worker, on any machine.

The GPU worker is orochi-worker-gpuhost: orochi-worker whose `--device gpu` runs the GPU forward
(model/llama_cuda.c) over the CPU stand-in for the GPU op set (kernels/cuda/kcuda_fake.c, which
computes the CPU part's bits), spawned by the coordinator through $OROCHI_GPU_WORKER_BIN. Each
worker takes whole KV heads, so the group's logits are one process's bits and every answer must
equal `orochi run --temp 0` token for token:

- cpu:1,gpu:1 in each memory mode (mapped: the arena read in place; mirror: device copies, the
  columns exchanged at every synchronisation point); the GPU worker's log names the stand-in and
  the mode;
- gpu:1 alone (its steps recorded as graphs and replayed: the count is in its log when it stops);
  with the ngram speculator (the workers' free run drafting by prompt lookup); and a second request
  that begins with the first's prompt (a copied prefix: the mirror must read the slot again,
  through the slot's epoch);
- f16 K/V with a GPU worker equals `orochi run --kv f16`;
- kill -9 of the GPU worker mid-request: the answer is exact, and the replacement mirrors the
  arena from scratch;
- one copy of the weights: cpu:1,gpu:1 with --gpu-weights device holds only its half of the rows
  on the device (the log's figure under the model's matrices), with --gpu-weights mapped none
  (read in place from the file), within --gpu-memory-limit; the answers as `orochi run`.
"""
import os
import re
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPTS = ["one two three four five", "the cat sat on the mat and the cat"]
N = 40


def gpu_worker_bin():
    return G.use_gpu_worker("orochi-worker-gpuhost")


def tiny(type_name="q4_1"):
    return G.mkmodel(layers=4, dim=128, ffn=256, heads=4, kv_heads=2, vocab=300, ctx=512, type=type_name,
                     seed=11)


@t.case
def gpu_group_memory_modes_equal_orochi_run():
    gpu_worker_bin()
    model = tiny()
    want = {p: G.run_ids(model, p, N) for p in PROMPTS}
    for mode in ("mapped", "mirror"):
        with G.Group("gpu-" + mode, model, devices="cpu:1,gpu:1", extra=["--gpu-memory", mode]) as g:
            for p in PROMPTS:
                G.check_eq(g.ids(p, N), want[p], "cpu:1,gpu:1 (%s), prompt %r" % (mode, p))
            wlog = g.log("worker-1")
            G.check("CPU standing in for a GPU" in wlog and "memory %s" % mode in wlog,
                    "the GPU worker's log does not name the stand-in and mode %s:\n%s", mode, wlog[-1500:])


@t.case
def gpu_alone_with_graphs_lookup_and_a_reused_prefix():
    gpu_worker_bin()
    model = tiny()
    long_prompt = "the cat sat on the mat and the cat sat on the mat and the"
    want = {p: G.run_ids(model, p, N) for p in PROMPTS + [long_prompt, long_prompt + " cat"]}
    with G.Group("gpu-alone", model, devices="gpu:1", extra=["--gpu-memory", "mirror"]) as g:
        for p in PROMPTS:
            G.check_eq(g.ids(p, N), want[p], "gpu:1, prompt %r" % p)
        # the second prompt begins with the first: its prefix is copied from the first's slot
        G.check_eq(g.ids(long_prompt, N), want[long_prompt], "gpu:1, the first of two prompts")
        r = g.complete(long_prompt + " cat", N)
        G.check_eq(r["orochi"]["token_ids"], want[long_prompt + " cat"], "gpu:1, the prompt that reuses a prefix")
        cached = r.get("usage", {}).get("prompt_tokens_details", {}).get("cached_tokens", 0)
        G.check(cached > 0, "the second prompt reused no prefix (usage %r)", r.get("usage"))
        G.log("  the second prompt started from %d cached tokens" % cached)
        wlog_before = g.log("worker-0")
    G.check("memory mirror, graphs on" in wlog_before, "the GPU worker did not say graphs on:\n%s",
            wlog_before[-1500:])
    with G.Group("gpu-lookup", model, devices="gpu:1", speculators=["ngram"]) as g:
        r = g.complete(long_prompt, N)
        G.check_eq(r["orochi"]["token_ids"], want[long_prompt], "gpu:1 with ngram")
        G.log("  gpu:1 with ngram: mean accepted %.2f" % r["orochi"]["mean_accepted"])
        g.down()  # the worker says how many steps it replayed when it stops
        wlog = g.log("worker-0")
    G.check("steps replayed from" in wlog, "the GPU worker's log has no graph count:\n%s", wlog[-1500:])
    line = [x for x in wlog.splitlines() if "steps replayed from" in x][-1]
    G.log("  %s" % line.split("worker-0: ")[-1])
    G.check(not line.split("GPU: ")[1].startswith("0 steps"), "no step was replayed: %s", line)


@t.case
def gpu_group_f16_kv_equals_orochi_run_f16():
    gpu_worker_bin()
    model = tiny()
    want = {p: G.run_ids(model, p, N, extra=["--kv", "f16"]) for p in PROMPTS}
    with G.Group("gpu-f16", model, devices="cpu:1,gpu:1", extra=["--kv", "f16"]) as g:
        for p in PROMPTS:
            G.check_eq(g.ids(p, N), want[p], "cpu:1,gpu:1 with f16 K/V, prompt %r" % p)


@t.case
def gpu_worker_sigkill_mid_request():
    gpu_worker_bin()
    # a model slow enough for the kill to land mid-request (the tiny one makes 200 tokens in 20 ms)
    model = G.mkmodel(layers=8, dim=512, ffn=1024, heads=8, kv_heads=2, vocab=300, ctx=2048, type="f32",
                      seed=7)
    n = 1200
    want = G.run_ids(model, PROMPTS[1], n)
    with G.Group("gpu-kill", model, devices="cpu:1,gpu:1", extra=["--gpu-memory", "mirror"]) as g:
        st = g.wait_status(lambda s: s.get("worker-1", {}).get("connected"), 30, "worker-1 connected")
        pid = st["worker-1"]["pid"]
        bg = G.Background(g, PROMPTS[1], n)
        bg.wait_started()
        os.kill(pid, signal.SIGKILL)
        G.check_eq(bg.result(), want, "the request that lost the GPU worker")
        g.wait_status(lambda s: s.get("worker-1", {}).get("connected") and s["worker-1"]["pid"] != pid, 60,
                      "worker-1 back")
        G.check_eq(g.ids(PROMPTS[1], 200), want[:200], "a request after the GPU worker's restart")


@t.case
def gpu_group_one_copy_of_the_weights():
    gpu_worker_bin()
    model = tiny()
    want = {p: G.run_ids(model, p, N) for p in PROMPTS}
    size_mib = os.path.getsize(model) / 2**20
    for weights in ("device", "mapped"):
        extra = ["--gpu-weights", weights, "--gpu-memory-limit", "64M"]
        with G.Group("gpu-w-" + weights, model, devices="cpu:1,gpu:1", extra=extra) as g:
            for p in PROMPTS:
                G.check_eq(g.ids(p, N), want[p], "cpu:1,gpu:1 (--gpu-weights %s), prompt %r" % (weights, p))
            wlog = g.log("worker-1")
            G.check("of 64.0 MiB allowed" in wlog, "the GPU worker's log does not say the limit:\n%s",
                    wlog[-1500:])
            if weights == "mapped":
                G.check("weights mapped in place" in wlog, "no 'weights mapped in place':\n%s", wlog[-1500:])
                continue
            m = re.search(r"weights on the device \(the part's rows, ([0-9.]+) MiB", wlog)
            G.check(m is not None, "the GPU worker's log does not give its rows:\n%s", wlog[-1500:])
            G.check(float(m.group(1)) < 0.7 * size_mib,
                    "the GPU part holds %s MiB of a %.2f MiB model: not its half of the rows", m.group(1),
                    size_mib)


if __name__ == "__main__":
    t.main()
