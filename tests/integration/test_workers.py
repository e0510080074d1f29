"""1, 2 and 3 workers give bit-identical logits.

Each worker computes a column shard of every layer (and its KV heads of attention); splitting must
not change a single bit of the logits. Under greedy decoding any difference in the logits that
matters shows up as a different token, so: the same prompts through groups of 1, 2 and 3 CPU
workers must give exactly the token ids of `orochi run --temp 0 --print-ids`, on tiny models of two
tensor types (f32 and the block-quantized q4_1, whose rows are sharded block-aligned), on K-quant
tiny models, and on the default model (3 KV heads) when it is present, as distributed and
re-quantized to K-quant mixes (Q4_K_M, Q5_K_M, Q6_K, Q5_1, Q3_K). A GPU worker that cannot start
(no usable device here) is reported with its reason and restarted ever more slowly, and it is
spawned with the coordinator's --gpu-memory, --gpu-graphs, --gpu-fuse and --gpu-att-parts.
"""
import os
import signal
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()

PROMPTS = [
    "hello world",
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "The quick brown fox jumps over the lazy dog. The quick brown fox",
    "a",
]
N = 40


def across_workers(model, prompts, n, counts=(1, 2, 3)):
    want = {p: G.run_ids(model, p, n) for p in prompts}
    for p, ids in want.items():
        G.check(len(ids) > 0, "orochi run generated nothing for %r", p)
    for w in counts:
        with G.Group("workers%d" % w, model, workers=w) as g:
            for p in prompts:
                r = g.complete(p, n)
                G.check_eq(r["orochi"]["token_ids"], want[p], "%d workers, prompt %r: token ids" % (w, p))
                G.check(r["usage"]["completion_tokens"] == len(want[p]),
                        "usage.completion_tokens %s != %d", r["usage"]["completion_tokens"], len(want[p]))
            G.log("  %d worker(s): %d prompts identical to orochi run" % (w, len(prompts)))


@t.case
def test_workers_f32_tiny():
    model = G.mkmodel(layers=4, dim=192, ffn=256, heads=6, kv_heads=6, vocab=300, ctx=256, type="f32", seed=2)
    across_workers(model, PROMPTS, N)


@t.case
def test_workers_q4_1_tiny():
    model = G.mkmodel(layers=3, dim=192, ffn=512, heads=6, kv_heads=6, vocab=300, ctx=256, type="q4_1", seed=3)
    across_workers(model, PROMPTS, N)


@t.case
def test_workers_gqa_tiny():
    # grouped-query attention: 6 query heads over 3 KV heads, one or more KV heads per worker
    model = G.mkmodel(layers=2, dim=192, ffn=256, heads=6, kv_heads=3, vocab=300, ctx=256, type="f16", seed=4)
    across_workers(model, PROMPTS[:2], N)


@t.case
def test_workers_default_model():
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    # special-token text in a prompt is that token for orochi run as for the group (one rule)
    across_workers(model, ["The capital of France is", "def add(a, b):",
                           "<|im_start|>user\nName a color.<|im_end|>\n<|im_start|>assistant\n"], 24)


@t.case
def test_workers_kquants_tiny():
    # K-quant matrices (256-column super-blocks) sharded by rows across workers
    for typ in ("q4_k", "q6_k"):
        model = G.mkmodel(layers=2, dim=256, ffn=512, heads=4, kv_heads=2, vocab=300, ctx=256,
                          type=typ, seed=5)
        across_workers(model, PROMPTS[:2], N, counts=(2,))


@t.case
def test_workers_default_requantized():
    # the default model as llama.cpp users keep it: K-quant mixes and the types they fall back to
    model = G.default_model()
    if not model:
        raise G.Skip("default model %s is absent (make models)" % G.env()["model"])
    for typ in ("Q4_K_M", "Q5_K_M", "Q6_K", "Q5_1", "Q3_K"):
        G.log("  %s:" % typ)
        across_workers(G.quantized(model, typ), ["The capital of France is"], 16, counts=(2,))


@t.case
def test_workers_more_than_kv_heads():
    # 4 workers on a model with 6 query heads of 3 KV heads: the even split gives each worker its
    # query heads, a KV head two workers share projected by both (--kv-dup, on for CPU groups),
    # and the answers equal orochi run's; with --kv-dup off the group refuses to start, and 7
    # workers are refused either way, each saying why
    model = G.mkmodel(layers=2, dim=192, ffn=256, heads=6, kv_heads=3, vocab=300, ctx=256, type="f32", seed=4)
    prompts = ["one two three four", "the cat sat on"]
    want = {p: G.run_ids(model, p, 24) for p in prompts}
    with G.Group("fourdup", model, workers=4) as g:
        for p in prompts:
            G.check_eq(g.ids(p, 24), want[p], "4 workers with kv_dup, prompt %r" % p)
    for workers, extra, said in ((4, ["--kv-dup", "off"], "KV heads"), (7, [], "query heads")):
        g = G.Group("toomany%d" % workers, model, workers=workers, extra=extra)
        g.port = G.free_port()
        G._LIVE_GROUPS.append(g)
        g.started = True
        try:
            r = g.launch(*g.up_args(), timeout=120, check=False)
            G.check(r.returncode != 0, "up with %d workers %s succeeded", workers, extra)
            text = r.stderr + g.log("coordinator")
            G.check(said in text, "the refusal does not mention %s:\n%s", said, text[-1500:])
        finally:
            g.down()


@t.case
def test_workers_gpu_without_device():
    # --workers gpu:1 where no GPU can be used: the worker's reason reaches the coordinator's log
    # (a build with CUDA: the driver's answer) or the worker's own (a build without: refused at
    # its command line), each failed start waits longer than the last, and the spawned command
    # line carries --gpu-memory, --gpu-graphs, --gpu-fuse and --gpu-att-parts; bad values of the
    # last are refused
    e = G.env()
    run_dir = os.path.join("/tmp", "orochi-it-%d" % os.getuid(), "gpu-%d" % os.getpid())
    subprocess.run(["rm", "-rf", run_dir], check=False)
    os.makedirs(run_dir)
    coord = os.path.join(e["bin_dir"], "orochi-coordinator")
    proc = subprocess.Popen([coord, "--run-dir", run_dir, "--target", G.mkmodel(), "--workers", "gpu:1",
                             "--port", str(G.free_port()), "--gpu-memory", "mirror", "--gpu-graphs", "off",
                             "--gpu-fuse", "off", "--gpu-att-parts", "3"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        time.sleep(6)
    finally:
        proc.send_signal(signal.SIGTERM)  # drains (nothing in flight) and removes its arena
        try:
            out = proc.communicate(timeout=30)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0]
    with open(os.path.join(run_dir, "cmd", "worker-0")) as f:
        argv = f.read().split("\n")
    G.check("--gpu-memory" in argv and argv[argv.index("--gpu-memory") + 1] == "mirror" and
            "--gpu-graphs" in argv and argv[argv.index("--gpu-graphs") + 1] == "off" and
            "--gpu-fuse" in argv and argv[argv.index("--gpu-fuse") + 1] == "off" and
            "--gpu-att-parts" in argv and argv[argv.index("--gpu-att-parts") + 1] == "3",
            "the GPU worker's command line lacks the GPU flags: %s", argv)
    with open(os.path.join(run_dir, "logs", "worker-0.log")) as f:
        wlog = f.read()
    G.check("worker-0 reports: GPU: CUDA device 0:" in out or "not available in this build" in wlog,
            "no reason for the failed GPU worker:\n%s\n%s", out[-1500:], wlog[-800:])
    # waits of 0.3, 0.6, 1.2, 2.4 s between starts: at most 5 in 6 s (without the back-off, one
    # every 0.3 s and about 20)
    spawns = out.count("spawned worker-0")
    G.check(1 <= spawns <= 5, "worker-0 spawned %d times in 6 s:\n%s", spawns, out[-1500:])
    subprocess.run(["rm", "-rf", run_dir], check=False)
    # a bad number of attention parts is refused at either command line, saying what it takes
    for binary, val in (("orochi-coordinator", "0"), ("orochi-worker", "257"), ("orochi-worker", "x")):
        r = subprocess.run([os.path.join(e["bin_dir"], binary), "--gpu-att-parts", val, "--run-dir", run_dir],
                           capture_output=True, text=True, timeout=30)
        G.check(r.returncode == 2 and "--gpu-att-parts" in r.stderr and "auto or 1..256" in r.stderr,
                "%s --gpu-att-parts %s was not refused with status 2 (%d): %s", binary, val, r.returncode,
                r.stderr[-600:])


if __name__ == "__main__":
    t.main()
