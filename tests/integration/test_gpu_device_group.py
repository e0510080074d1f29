"""Groups whose GPU worker runs on a real CUDA device: `orochi-worker --device gpu` itself, spawned by
the coordinator (no stand-in). Skipped, saying why, where the build has no CUDA or the machine no
usable device (CI's machines); deploy/gpu-check.sh runs it on a lent GPU.

Losslessness within each group, token for token (the GPU's numbers are not the CPU's bits):
- the tiny model: cpu:1,gpu:1 in mirror mode with the ngram speculator equals the same group without
  it, mapped mode equals mirror, and so does mirror with one launch per op (--gpu-fuse off);
  mirror with attention cut into 3 parts (--gpu-att-parts 3) with the ngram speculator equals
  its own plain answers; gpu:1 alone (mapped, steps replayed from CUDA graphs) with the ngram
  speculator equals its plain answers, and the worker says it replayed steps;
- each model named in $OROCHI_GPU_MODELS (colon-separated paths: the default model, a 1B mkmodel
  shape), on one longer prompt ($OROCHI_GPU_PROMPT; an instruct model wants its chat format there): cpu:1,gpu:1 (mirror) and gpu:1 (mapped), each with and without the
  ngram speculator; the wall time of each answer is logged.
The agreement of each plain answer with `orochi run --temp 0` (the CPU's numbers) is logged, not
required.
"""
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402
import gpu_groups as GG  # noqa: E402

t = G.Tests()

# the bench's kind of request for the larger models: an instruction whose answer repeats its words
BIG_PROMPT = os.environ.get("OROCHI_GPU_PROMPT", "Repeat this list three times, separated by commas: apple, "
                            "river, stone, lantern, garden, copper, violin, harbour.")
BIG_N = 96


# $OROCHI_GPU_DEVICE_STANDIN=orochi-worker-gpuemu checks this file itself without a GPU: the groups'
# GPU workers are then the CUDA emulation's (test_gpu_emu_group.py is that emulation's real test)
STANDIN = os.environ.get("OROCHI_GPU_DEVICE_STANDIN")


def need_device():
    """Skip unless this build has CUDA and the machine a usable device (probed by
    orochi-gpu-agreement on one token of the tiny model)."""
    if STANDIN:
        G.use_gpu_worker(STANDIN)
        return
    tool = G.built("orochi-gpu-agreement", " (this build has no CUDA)")
    prompts = os.path.join(G.env()["source"], "bench", "prompts.jsonl")
    r = subprocess.run([tool, "--model", GG.tiny(), "--prompts", prompts, "--tokens", "1", "--limit", "1"],
                       capture_output=True, text=True, timeout=300)
    if r.returncode != 0 and "CUDA device" in r.stderr:
        G.skip("no usable CUDA device here: " + r.stderr.strip().splitlines()[-1])
    G.check(r.returncode == 0, "orochi-gpu-agreement failed on the tiny model (%d): %s", r.returncode, r.stderr)
    os.environ.pop("OROCHI_GPU_WORKER_BIN", None)  # the coordinator spawns orochi-worker itself


@t.case
def tiny_model_groups_are_lossless():
    need_device()
    model = GG.tiny()
    cpu = {p: G.run_ids(model, p, GG.N) for p in GG.PROMPTS}
    plain, accepted, logs = GG.lookup_equals_plain("dev", model, "cpu:1,gpu:1", "mirror", GG.PROMPTS, GG.N)
    G.check(max(accepted) > 1.0, "prompt lookup drafted nothing that was accepted: %r", accepted)
    G.check("memory mirror" in logs[1] and (STANDIN or ("stand" not in logs[1] and "emulat" not in logs[1])),
            "the GPU worker's log does not say it runs a device in mirror mode:\n%s", logs[1][-1500:])
    for p in GG.PROMPTS:
        G.log("  cpu:1,gpu:1 against orochi run, prompt %r: %s" % (p, GG.agreement(plain[p], cpu[p])))
    with G.Group("dev-mapped", model, devices="cpu:1,gpu:1", extra=["--gpu-memory", "mapped"]) as g:
        for p in GG.PROMPTS:
            G.check_eq(g.ids(p, GG.N), plain[p], "cpu:1,gpu:1 mapped against mirror, prompt %r" % p)
    GG.unfused_equals("dev-unfused", model, GG.PROMPTS, GG.N, plain)
    GG.cut_is_lossless("dev-cut", model, GG.PROMPTS, GG.N, plain)
    _, accepted, logs = GG.lookup_equals_plain("dev-alone", model, "gpu:1", "mapped", GG.PROMPTS, GG.N)
    G.check(max(accepted) > 1.0, "prompt lookup drafted nothing that was accepted: %r", accepted)
    GG.check_replayed(logs[0])


@t.case
def named_models_groups_are_lossless():
    need_device()
    models = [m for m in os.environ.get("OROCHI_GPU_MODELS", "").split(":") if m]
    if not models:
        G.log("  no models named in $OROCHI_GPU_MODELS: only the tiny model was run")
        return
    for m in models:
        G.check(os.path.isfile(m), "$OROCHI_GPU_MODELS names %s, which is not a file", m)
        G.log("  %s (%.0f MiB)" % (m, os.path.getsize(m) / 2**20))
        cpu = G.run_ids(m, BIG_PROMPT, BIG_N)
        for devices, mode in (("cpu:1,gpu:1", "mirror"), ("gpu:1", "mapped")):
            plain, _, logs = GG.lookup_equals_plain("dev-" + os.path.basename(m), m, devices, mode, [BIG_PROMPT],
                                                    BIG_N)
            G.log("  %s against orochi run: %s" % (devices, GG.agreement(plain[BIG_PROMPT], cpu)))
            if devices == "gpu:1":
                G.log("  worker-%s" % (GG.replayed(logs[0]) or "0: no replay line"))


if __name__ == "__main__":
    t.main()
