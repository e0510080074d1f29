"""A group whose GPU worker runs the GPU op set's own kernels, in the CUDA emulation, on any machine.

The GPU worker is orochi-worker-gpuemu: orochi-worker linked against kernels/cuda's kernels as the
CUDA emulation runs them on the CPU (tests/cuda_emu; docs/gpu.md), spawned by the coordinator
through $OROCHI_GPU_WORKER_BIN. Its numbers are the GPU kernels' (f32 activations into the
quantized matmuls, warp reductions, the per-warp online softmax), not the CPU's bits, so what must
hold is losslessness within each group, token for token:

- cpu:1,gpu:1 (mirror): the answer with the ngram speculator (prompt lookup in the workers' free
  run, verified as trees, some accepted) equals the same group's answer without it;
- gpu:1 alone (mirror, its steps replayed as CUDA graphs): the same, and the worker says it
  replayed steps;
- cpu:1,gpu:1 (mapped) equals the mirror group's answer, and so does cpu:1,gpu:1 (mirror) with one
  launch per op (--gpu-fuse off) instead of the fused launches;
- cpu:1,gpu:1 (mirror) with attention cutting every key stream into 3 parts (--gpu-att-parts 3):
  the answer with the ngram speculator equals its own without it (the cut changes the rounding,
  so its agreement with the uncut group is reported).

The agreement with `orochi run --temp 0` (the CPU's numbers) is reported, not required: the
length of the common prefix of each answer and the matching tokens.

orochi-gpu-agreement-emu on the tiny model and two bench prompts: its JSON lines count the steps,
the logits stay within the Q4_1 tolerance of the GPU forward test (relative L2 3e-3), and every
greedy token agrees or is a near tie; a bad option is refused with status 2, naming it.

The same tool on models of every other quantized type (Q4_K, Q5_K, Q6_K, Q2_K, Q3_K, Q5_0, Q5_1,
IQ4_NL), with the CUDA-core and the tensor-core matmul: every greedy token agrees with the CPU's.

orochi-emu (the CLI with the GPU forward over the emulation) runs the `orochi bench --plans`
commands deploy/gpu-check.sh runs on a GPU, on the tiny model: the GPU alone in each memory mode
with graphs off and on, with one launch per op (whose steps queue 11 more ops a layer), with
the quantized matmul's other loads in flight and its default (2 at width 1, 1 at 8), with
attention cut into 3 parts (one join launch more a layer) and one key a warp, tiles off, with the
tiled attention cut into 2, and no tiles by default at this short context, with the tensor-core
matmul's inputs in fragment order from 1 token (one launch more before each matmul at widths 1
and 8); a 70-token prompt (--prompt) timed with its share of the tensor cores, the token
tiles in 4 groups of blocks (--gpu-groups: 4 used at width 32, 1 at width 1), the tensor-core
matmul launched early (--gpu-early on) and its 8 blocks in flight by default (one tile a pass
at both widths); bad --gpu-att-parts, --gpu-att-keys, --gpu-att-tile, --gpu-unroll, --gpu-frag,
--gpu-groups, --gpu-depth and --gpu-early values refused; every row with the tensor cores' measured rate and its step's share of it; GPU + CPU under HCMP, the dense/sparse split and
Megatron in each memory mode; and the partition search, which must write a two-part partition.

bench/gpu_profile.py (the summary of bench/gpu-profile.sh's Nsight Compute CSV) on a CSV written
here: the launches, times and GB/s per kernel and shape, what bounds each kernel as the
time-weighted mean of its launches' occupancy, issue, L1, L2 and DRAM shares, each kernel's four
largest warp stall reasons (time-weighted, the largest first), and no such columns or lines for a
CSV without those metrics.

bench/gpu_summary.py (deploy/gpu-check.sh's summary.md) on JSON lines written here: the issue's
rows from the fastest default run (its roofline share, the width-64 over width-1 ratio, the
prompt's share of the tensor cores, each met or short against the 8B and 1B targets), the
tensor-core variants with the fastest marked, and the peer's rates on a GPU beside orochi's.

bench/sass_mix.py's reading of cuobjdump's listing (written here): each kernel's hot loop is the
innermost backward branch with the most global loads (not the loop around both loops, which
holds more), its instructions counted by opcode without their
predicates and modifiers, loads, products and both kinds of conversion apart; cuobjdump's
resource listing read into each kernel's registers, stack bytes (its spills) and local bytes.
"""
import json
import subprocess
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402
import gpu_groups as GG  # noqa: E402

t = G.Tests()


LEFT_OUT = " (the CUDA emulation is left out of sanitizer builds)"


def gpu_worker_bin():
    return G.use_gpu_worker("orochi-worker-gpuemu", LEFT_OUT)


@t.case
def gpu_emu_group_speculation_is_lossless():
    gpu_worker_bin()
    model = GG.tiny()
    cpu = {p: G.run_ids(model, p, GG.N) for p in GG.PROMPTS}
    plain = {}
    with G.Group("emu-mirror", model, devices="cpu:1,gpu:1", extra=["--gpu-memory", "mirror"]) as g:
        for p in GG.PROMPTS:
            plain[p] = g.ids(p, GG.N)
            G.log("  cpu:1,gpu:1 against orochi run, prompt %r: %s" % (p, GG.agreement(plain[p], cpu[p])))
        wlog = g.log("worker-1")
    G.check("CUDA emulator" in wlog, "the GPU worker's log does not name the emulation:\n%s", wlog[-1500:])
    with G.Group("emu-mapped", model, devices="cpu:1,gpu:1", extra=["--gpu-memory", "mapped"]) as g:
        for p in GG.PROMPTS:
            G.check_eq(g.ids(p, GG.N), plain[p], "cpu:1,gpu:1 mapped against mirror, prompt %r" % p)
    GG.unfused_equals("emu-unfused", model, GG.PROMPTS, GG.N, plain)
    GG.cut_is_lossless("emu-cut", model, GG.PROMPTS, GG.N, plain)
    _, accepted, _ = GG.lookup_equals_plain("emu", model, "cpu:1,gpu:1", "mirror", GG.PROMPTS, GG.N, plain)
    G.check(max(accepted) > 1.0, "prompt lookup drafted nothing that was accepted: %r", accepted)


@t.case
def gpu_emu_alone_with_graphs_is_lossless():
    gpu_worker_bin()
    _, accepted, logs = GG.lookup_equals_plain("emu-alone", GG.tiny(), "gpu:1", "mirror", GG.PROMPTS, GG.N)
    G.check(max(accepted) > 1.0, "prompt lookup drafted nothing that was accepted: %r", accepted)
    GG.check_replayed(logs[0])


@t.case
def gpu_agreement_tool_reports_steps_and_differences():
    tool = G.built("orochi-gpu-agreement-emu", LEFT_OUT)
    prompts = os.path.join(G.env()["tmp"], "gpu-agreement-prompts.jsonl")
    with open(os.path.join(G.env()["source"], "bench", "prompts.jsonl")) as f, open(prompts, "w") as out:
        out.writelines(f.readlines()[:2])
    js = os.path.join(G.env()["tmp"], "gpu-agreement.jsonl")
    if os.path.exists(js):
        os.remove(js)
    r = subprocess.run([tool, "--model", GG.tiny(), "--prompts", prompts, "--tokens", "8", "--json", js],
                       capture_output=True, text=True, timeout=300)
    G.check(r.returncode == 0, "orochi-gpu-agreement-emu failed (%d): %s", r.returncode, r.stderr)
    G.log("  " + r.stdout.strip().splitlines()[-1])
    with open(js) as f:
        rows = [json.loads(x) for x in f]
    G.check(len(rows) == 3 and [x["steps"] for x in rows] == [8, 8, 16],
            "the JSON lines do not count 8 steps a prompt: %r", rows)
    for x in rows:
        G.check(x["worst_rel_l2"] < 3e-3, "%s: relative L2 %g over the Q4_1 tolerance", x["prompt"],
                x["worst_rel_l2"])
        G.check(x["agree"] + x["near_ties"] == x["steps"], "%s: greedy tokens differ beyond near ties: %r",
                x["prompt"], x)
    bad = subprocess.run([tool, "--model", GG.tiny(), "--gpu-memory", "bogus"], capture_output=True, text=True,
                         timeout=60)
    G.check(bad.returncode == 2 and "--gpu-memory bogus" in bad.stderr,
            "a bad --gpu-memory was not refused with status 2 (%d): %s", bad.returncode, bad.stderr)


@t.case
def quant_kernels_agree_with_the_cpu_over_the_emulation():
    """Models of Q4_K, Q5_K, Q6_K, Q2_K, Q3_K (256-column rows: a K-quant super-block), Q5_0, Q5_1
    and IQ4_NL, on the CUDA-core and the tensor-core matmul: every greedy token of two prompts
    equals the CPU's."""
    tool = G.built("orochi-gpu-agreement-emu", LEFT_OUT)
    prompts = os.path.join(G.env()["tmp"], "gpu-agreement-prompts-k.jsonl")
    with open(os.path.join(G.env()["source"], "bench", "prompts.jsonl")) as f, open(prompts, "w") as out:
        out.writelines(f.readlines()[:2])
    for typ in ("q4_k", "q5_k", "q6_k", "q2_k", "q3_k", "q5_0", "q5_1", "iq4_nl"):
        model = G.mkmodel(layers=2, dim=256, ffn=512, heads=4, kv_heads=2, vocab=512, ctx=256,
                          type=typ, seed=3)
        for kind in ("cuda", "tensor"):
            js = os.path.join(G.env()["tmp"], "gpu-agreement-k.jsonl")
            if os.path.exists(js):
                os.remove(js)
            r = subprocess.run([tool, "--model", model, "--prompts", prompts, "--tokens", "8",
                                "--gpu-matmul", kind, "--json", js],
                               capture_output=True, text=True, timeout=600)
            G.check(r.returncode == 0, "%s %s: orochi-gpu-agreement-emu failed (%d): %s", typ, kind,
                    r.returncode, r.stderr[-400:])
            if r.returncode:
                continue
            with open(js) as f:
                total = [json.loads(x) for x in f][-1]
            G.log("  %s, %s matmul: %d/%d greedy tokens agree, worst relative L2 %.2g" % (
                typ, kind, total["agree"], total["steps"], total["worst_rel_l2"]))
            G.check(total["agree"] == total["steps"] == 16, "%s %s: greedy tokens differ: %r", typ,
                    kind, total)


@t.case
def gpu_check_bench_commands_run_over_the_emulation():
    cli = G.built("orochi-emu", LEFT_OUT)
    model = GG.tiny()
    js = os.path.join(G.env()["tmp"], "gpu-emu-plans.jsonl")
    if os.path.exists(js):
        os.remove(js)
    common = ["bench", "--plans", "--model", model, "--widths", "1,8", "--reps", "1", "--ctx", "64", "--json", js]
    runs = []
    for mem, graphs, fuse, unroll, cut in (("mapped", "off", "on", "1", []), ("mirror", "off", "on", "auto", []),
                                           ("mirror", "on", "on", "4", []), ("mapped", "on", "on", "1", []),
                                           ("mirror", "off", "off", "2", []),
                                           ("mirror", "off", "on", "1", ["--gpu-att-parts", "3",
                                                                         "--gpu-att-keys", "1",
                                                                         "--gpu-att-tile", "off"]),
                                           ("mirror", "off", "on", "1", ["--gpu-att-parts", "2",
                                                                         "--gpu-att-tile", "on"]),
                                           ("mirror", "off", "on", "auto", ["--gpu-frag", "on"])):
        runs.append(common + ["--parts", "1", "--devices", "gpu", "--plan", "hcmp:even", "--gpu-memory", mem,
                              "--gpu-graphs", graphs, "--gpu-fuse", fuse, "--gpu-unroll", unroll] + cut)
    for mem in ("mapped", "mirror"):
        runs.append(common + ["--parts", "2", "--devices", "gpu,cpu", "--threads-per-part", "1", "--gpu-memory",
                              mem, "--plan", "hcmp:0.9/0.1", "--plan", "split:0.9/0.1", "--plan",
                              "megatron:0.9/0.1"])
    for args in runs:
        r = subprocess.run([cli] + args, capture_output=True, text=True, timeout=300)
        G.check(r.returncode == 0, "orochi-emu %s failed (%d): %s", " ".join(args[5:]), r.returncode,
                r.stderr[-1500:])
    with open(js) as f:
        rows = [json.loads(x) for x in f]
    G.check(len(rows) == 8 * 2 + 2 * 3 * 2, "%d JSON rows, not 28", len(rows))
    G.check([x["gpu_fuse"] for x in rows[:10]] == [True] * 8 + [False] * 2 and
            [x["gpu_unroll"] for x in rows[:10]] == [1] * 2 + [2, 1] + [4] * 2 + [1] * 2 + [2] * 2 and
            [x["gpu_unroll_ask"] for x in rows[:4]] == [1, 1, 0, 0],
            "the rows do not say which launches ran (by default 2 groups in flight at W=1, 1 at W=8): %r",
            rows[:10])
    # one launch per op queues 11 more ops a layer (mirror) than the fused launches, at each width
    saved = [rows[8 + i]["gpu_ops"] - rows[2 + i]["gpu_ops"] for i in range(2)]
    G.check(saved == [11 * 4, 11 * 4], "ops a step saved by the fused launches over 4 layers: %r (want 44)",
            saved)
    # attention cut into 3 parts: one join launch more a layer; the emulation's one multiprocessor
    # never cuts by length; by default no tiles at a context this short (8 x 72 keys)
    how = [(x["gpu_att_ask"], x["gpu_att_parts"], x["gpu_att_keys"], x["gpu_att_tile_ask"], x["gpu_att_tile"])
           for x in rows[:14]]
    G.check(how[10:14] == [(3, 3, 1, "off", False)] * 2 + [(2, 2, 4, "on", True)] * 2 and
            how[2:4] == [(0, 1, 4, "auto", False)] * 2,
            "the rows do not say how attention ran: %r", how)
    joins = [rows[k + i]["gpu_ops"] - rows[2 + i]["gpu_ops"] for k in (10, 12) for i in range(2)]
    G.check(joins == [4] * 4, "ops a step the parts' joins add over 4 layers: %r (want 4)", joins)
    # the tensor-core matmul's inputs in fragment order: by default not at widths 1 and 8, asked
    # from 1 token: one launch more before each matmul launch (4 a layer and the LM head)
    frag = [(x["gpu_frag_ask"], x["gpu_frag"]) for x in rows[2:4] + rows[14:16]]
    G.check(frag == [("auto", False)] * 2 + [("on", True)] * 2,
            "the rows do not say where the inputs went in fragment order: %r", frag)
    more = [rows[14 + i]["gpu_ops"] - rows[2 + i]["gpu_ops"] for i in range(2)]
    G.check(more == [4 * 4 + 1] * 2,
            "ops a step the fragment order adds over 4 layers: %r (want 17, 17)", more)
    G.check(all(x["ms"] > 0 and "gpu" in x["devices"] for x in rows), "a row without a GPU step time: %r", rows)
    # the tensor cores' instruction timed (over the emulation: its own slow rate), and each step's
    # matmul flops set against it
    G.check(all(x["mma_tflops"] > 0 and x["tc_share"] > 0 for x in rows),
            "a row without the tensor cores' rate or its share: %r", [(x["mma_tflops"], x["tc_share"]) for x in rows])
    for flag, val, says in (("--gpu-att-parts", "0", "auto or 1..256"), ("--gpu-att-keys", "2", "1 or 4"),
                            ("--gpu-att-tile", "yes", "auto, on or off"), ("--gpu-unroll", "3", "auto, 1, 2 or 4"),
                            ("--gpu-frag", "2", "auto, on or off"), ("--gpu-groups", "3", "auto, 1, 2, 4 or 8"),
                            ("--gpu-depth", "2", "auto, 4 or 8"), ("--gpu-early", "yes", "on or off")):
        r = subprocess.run([cli] + common + [flag, val], capture_output=True, text=True, timeout=60)
        G.check(r.returncode == 2 and "%s %s: %s" % (flag, val, says) in r.stderr,
                "%s %s was not refused with status 2 (%d): %s", flag, val, r.returncode, r.stderr)
    # a prompt from position 0 in chunks of 64 (64 + 6 tokens) on the GPU alone, its matmul flops
    # set against the tensor cores' rate; the tensor-core matmul's token tiles in 4 groups of
    # blocks (one group at width 1, 4 at width 32)
    pjs = js + ".prompt"
    if os.path.exists(pjs):
        os.remove(pjs)
    r = subprocess.run([cli, "bench", "--plans", "--model", model, "--widths", "1,32", "--reps", "1", "--ctx", "16",
                        "--prompt", "70", "--parts", "1", "--devices", "gpu", "--plan", "hcmp:even",
                        "--gpu-groups", "4", "--gpu-early", "on", "--json", pjs],
                       capture_output=True, text=True, timeout=300)
    G.check(r.returncode == 0 and "a 70-token prompt from position 0" in r.stdout and
            "of the tensor cores" in r.stdout and "tensor-core token groups (asked): W=1 1 W=32 4" in r.stdout,
            "bench --prompt on the GPU (%d): %s%s", r.returncode, r.stdout, r.stderr[-1500:])
    with open(pjs) as f:
        prows = [json.loads(x) for x in f]
    prow = [x for x in prows if x["bench"] == "plans_prompt"]
    G.check(len(prow) == 1 and prow[0]["prompt"] == 70 and prow[0]["devices"] == "gpu" and
            prow[0]["tc_share"] > 0 and prow[0]["mma_tflops"] > 0 and prow[0]["gpu_groups_ask"] == 4,
            "the prompt's row: %r", prow)
    G.check([(x["gpu_groups_ask"], x["gpu_groups"]) for x in prows if x["bench"] == "plans"] == [(4, 1), (4, 4)],
            "the rows do not say the token groups: %r", prows)
    # one token tile a pass at both widths (32 tokens in 4 groups), the q/k/v launch's few blocks
    # all resident (the emulation holds 64 a multiprocessor): 8 blocks in flight a warp by default
    G.check([(x["gpu_depth_ask"], x["gpu_depth"]) for x in prows if x["bench"] == "plans"] == [(0, 8), (0, 8)] and
            "tensor-core blocks in flight a warp, q/k/v (by size): W=1 8 W=32 8" in r.stdout,
            "the rows do not say the blocks in flight: %r", prows)
    G.check(all(x["gpu_early"] for x in prows if x["bench"] == "plans") and "the tensor-core matmul early" in r.stdout,
            "the rows do not say the matmul was launched early: %r", prows)
    plan = os.path.join(G.env()["tmp"], "gpu-emu-search.json")
    if os.path.exists(plan):
        os.remove(plan)
    r = subprocess.run([cli, "bench", "--plans", "--model", model, "--parts", "2", "--devices", "gpu,cpu",
                        "--threads-per-part", "1", "--widths", "1", "--reps", "1", "--ctx", "64", "--search", plan],
                       capture_output=True, text=True, timeout=300)
    G.check(r.returncode == 0, "the partition search failed (%d): %s", r.returncode, r.stderr[-1500:])
    with open(plan) as f:
        part = json.load(f)["partition"]
    G.check(part["parts"] == 2 and all(abs(sum(part[k]) - 1) < 1e-3 for k in ("qkv", "wo", "lm_head")),
            "the search wrote no two-part partition: %r", part)
    G.log("  partition found for GPU + CPU over the emulation: qkv %r, ffn_up %r" % (part["qkv"], part["ffn_up"]))


NCU_HEAD = ['"ID"', '"Kernel Name"', '"Block Size"', '"Grid Size"', '"Metric Name"', '"Metric Unit"', '"Metric Value"']


def ncu_csv(path, launches, bounds, stalls=None):
    """An Nsight Compute CSV (--csv --print-units base) of `launches`: (id, name, grid, ns, bytes,
    occupancy %) each, 40 registers a thread, the occupancy and a flat 50% of every other bound
    metric when `bounds`; stalls: {launch id: {reason: warps per issue}}, the warp stall metrics."""
    lines = [",".join(NCU_HEAD)]
    extra = ["sm__inst_issued.avg.pct_of_peak_sustained_active", "l1tex__throughput.avg.pct_of_peak_sustained_active",
             "lts__throughput.avg.pct_of_peak_sustained_elapsed", "dram__throughput.avg.pct_of_peak_sustained_elapsed"]
    for i, name, grid, ns, rd, occ in launches:
        metrics = [("gpu__time_duration.sum", "ns", ns), ("dram__bytes_read.sum", "byte", rd)]
        if bounds:
            metrics.append(("launch__registers_per_thread", "register/thread", 40))
            metrics.append(("sm__warps_active.avg.pct_of_peak_sustained_active", "%", occ))
            metrics += [(m, "%", 50.0) for m in extra]
        for reason, v in (stalls or {}).get(i, {}).items():
            metrics.append(("smsp__average_warps_issue_stalled_%s_per_issue_active.ratio" % reason, "", v))
        for m, unit, v in metrics:
            lines.append('"%d","%s","(256, 1, 1)","%s","%s","%s","%s"' % (i, name, grid, m, unit, "{:,}".format(v)))
    with open(path, "w") as f:
        f.write("==PROF== Connected to process\n" + "\n".join(lines) + "\n")


@t.case
def gpu_profile_summary_reads_bounds():
    tool = os.path.join(G.env()["source"], "bench", "gpu_profile.py")
    path = os.path.join(G.env()["tmp"], "ncu-fixture.csv")
    mma = "void k_mma<24u, 0, 1, 4, 1, false>(kq_job)"
    launches = [(0, "void k_embed<12u>(const unsigned char *, int)", "(1, 1, 1)", 1000.0, 0.0, 10.0),
                (1, mma, "(256, 1, 1)", 3000.0, 3.0e6, 20.0),
                (2, mma, "(256, 1, 1)", 1000.0, 1.0e6, 60.0)]
    ncu_csv(path, launches, True)
    r = subprocess.run([sys.executable, tool, path, "--title", "fixture"], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 0, "gpu_profile.py failed (%d): %s", r.returncode, r.stderr)
    lines = r.stdout.splitlines()
    G.check(lines[0] == "== fixture: 3 launches, 0.005 ms of kernel time, 1 steps: 0.005 ms a step",
            "the summary's first line: %r", lines[0])
    G.check(lines[1].split()[-6:] == ["regs", "occ%", "issue%", "L1%", "L2%", "DRAM%"], "the bound columns: %r",
            lines[1])
    row = next(x for x in lines if x.startswith("void k_mma<24u, 0, 1, 4, 1, false>") and "(256, 1, 1)" in x).split()
    # 2 launches, 4 us, 80% of the time, 1000 GB/s; occupancy weighted by time: (3 * 20 + 1 * 60) / 4 = 30
    G.check(row[-11:] == ["2", "0.004", "2.00", "80.0%", "1000.0", "40", "30", "50", "50", "50", "50"],
            "the k_mma row: %r", row)
    G.check("stalled" not in r.stdout, "stall lines without stall metrics: %s", r.stdout)
    # the stalls: time-weighted per kernel name, the largest 4 of 5 reasons first; a kernel
    # without stall metrics has no line
    stalls = {1: {"long_scoreboard": 4.0, "barrier": 1.0, "wait": 0.5, "not_selected": 0.2,
                  "mio_throttle": 0.1},
              2: {"long_scoreboard": 8.0, "barrier": 1.0, "wait": 4.5, "not_selected": 0.2,
                  "mio_throttle": 0.1}}
    ncu_csv(path, launches, True, stalls)
    r = subprocess.run([sys.executable, tool, path], capture_output=True, text=True, timeout=60)
    out = r.stdout.splitlines()
    at = next((i for i, x in enumerate(out) if x.startswith("warps stalled per instruction issued")), None)
    G.check(r.returncode == 0 and at is not None, "no stall lines (%d): %s", r.returncode, r.stdout)
    if at is not None:
        # long_scoreboard (3 * 4 + 1 * 8) / 4 = 5, wait (3 * 0.5 + 4.5) / 4 = 1.5, barrier 1,
        # not_selected 0.2
        G.check(out[at + 1:] == ["  %-40s %s" % ("void k_mma<24u, 0, 1, 4, 1, false>",
                                                "long_scoreboard 5.00  wait 1.50  barrier 1.00  "
                                                "not_selected 0.20")],
                "the stall lines: %r", out[at + 1:])
    ncu_csv(path, launches, False)
    r = subprocess.run([sys.executable, tool, path], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 0 and "occ%" not in r.stdout and "regs" not in r.stdout and r.stdout.splitlines()[1].split()[-1] == "GB/s",
            "without the bound metrics the summary still printed their columns (%d): %s", r.returncode, r.stdout)
    with open(path, "w") as f:
        f.write("not a profile\n")
    r = subprocess.run([sys.executable, tool, path], capture_output=True, text=True, timeout=60)
    G.check(r.returncode != 0 and "no ncu CSV header" in r.stderr, "a file without a header: %d %s", r.returncode, r.stderr)


def plans_row(model, kind, width, ms, roofline=0.0, frag="auto", groups=0, depth=0):
    return {"bench": "plans", "plan": "hcmp:even", "width": width, "ms": ms, "parts": 1, "devices": "gpu",
            "model": model, "gpu_memory": "mirror", "gpu_graphs": True, "gpu_fuse": True, "gpu_unroll_ask": 0,
            "gpu_att_ask": 0, "gpu_matmul": kind, "gpu_frag_ask": frag, "gpu_groups_ask": groups,
            "gpu_depth_ask": depth, "roofline": roofline}


@t.case
def gpu_summary_reports_the_issue_rows():
    tool = os.path.join(G.env()["source"], "bench", "gpu_summary.py")
    plans = os.path.join(G.env()["tmp"], "summary-plans.jsonl")
    peer = os.path.join(G.env()["tmp"], "summary-peer.jsonl")
    b8, b1 = "gc-8b-q4_k.gguf", "gc-1b-q4_k.gguf"
    rows = [plans_row(b8, "tensor", 1, 10.0, 0.10), plans_row(b8, "tensor", 1, 8.0, 0.62),
            plans_row(b8, "tensor", 64, 15.0), plans_row(b8, "cuda", 1, 20.0, 0.31),
            plans_row(b8, "tensor", 64, 14.0, frag="on"), plans_row(b8, "tensor", 64, 12.0, groups=4),
            plans_row(b8, "tensor", 1, 7.5, 0.70, depth=8),  # a variant, not the default's row
            plans_row(b1, "tensor", 1, 2.0, 0.30),
            dict(plans_row(b8, "tensor", 1, 1.0, 0.99), devices="gpu,cpu", parts=2)]  # not the GPU alone
    for ms, share in ((1000.0, 0.45), (1500.0, 0.30)):
        rows.append({"bench": "plans_prompt", "plan": "hcmp:even", "prompt": 2048, "ms": ms, "tok_s": 2048 / (ms / 1e3),
                     "parts": 1, "devices": "gpu", "model": b8, "gpu_matmul_ask": "auto", "gpu_frag_ask": "auto",
                     "gpu_groups_ask": 0, "tc_share": share})
    with open(plans, "w") as f:
        f.write("not json\n" + "".join(json.dumps(x) + "\n" for x in rows))
    with open(peer, "w") as f:
        for gen, prompt, ts, info in ((128, 0, 150.0, "NVIDIA H200"), (128, 0, 140.0, "NVIDIA H200"),
                                      (0, 64, 2000.0, "NVIDIA H200"), (0, 2048, 5000.0, "NVIDIA H200"),
                                      (128, 0, 999.0, "")):
            f.write(json.dumps({"model_filename": "/tmp/" + b8, "n_gen": gen, "n_prompt": prompt, "avg_ts": ts,
                                "gpu_info": info}) + "\n")
    r = subprocess.run([sys.executable, tool, plans, peer], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 0, "gpu_summary.py failed (%d): %s", r.returncode, r.stderr)
    lines = r.stdout.splitlines()
    for want in ("| gc-8b-q4_k.gguf | tensor | 8.00 | 62.0% met | 15.00 | 1.88 met | 1000.00 | 45.0% met |",
                 "| gc-8b-q4_k.gguf | cuda | 20.00 | 31.0% short | - | - | - | - |",
                 "| gc-1b-q4_k.gguf | tensor | 2.00 | 30.0% short | - | - | - | - |",
                 "| model | W | frag auto, groups 4, depth auto | frag auto, groups auto, depth 8 | "
                 "frag auto, groups auto, depth auto | frag on, groups auto, depth auto |",
                 "| gc-8b-q4_k.gguf | 1 | - | 7.50* | 8.00 | - |",
                 "| gc-8b-q4_k.gguf | 64 | 12.00* | - | 15.00 | 14.00 |",
                 "| gc-8b-q4_k.gguf | 150.0 | 125.0 | 2000.0 | 4266.7 | 5000.0 | 2048.0 |"):
        G.check(want in lines, "no line %r in the summary:\n%s", want, r.stdout)
    r = subprocess.run([sys.executable, tool, plans], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 0 and "peer" not in r.stdout, "without the peer's file (%d): %s", r.returncode, r.stdout)


SASS_FIXTURE = """
Fatbin elf code:
	code for sm_90
		Function : _Z3fooi
	.headerflags	@"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   MOV R1, c[0x0][0x28] ;                  /* 0x00000a0000017a02 */
        /*0010*/                   LDG.E R2, desc[UR4][R2.64] ;            /* 0x0000000402027981 */
        /*0020*/                   I2F.U8 R3, R2 ;                         /* 0x0000000200037306 */
        /*0030*/                   LDG.E R4, desc[UR4][R4.64] ;            /* 0x0000000404047981 */
        /*0040*/                   I2FP.F32.U32 R5, R4 ;                   /* 0x0000000400057245 */
        /*0050*/                   HMMA.16816.F32 R8, R4, R6, R8 ;         /* 0x000000060408723c */
        /*0060*/              @!P0 BRA 0x30 ;                              /* 0xfffffffc00f08947 */
        /*0070*/                   LDG.E R4, desc[UR4][R4.64] ;            /* 0x0000000404047981 */
        /*0080*/               @P1 LDG.E.128 R4, desc[UR4][R6.64] ;        /* 0x0000000406041981 */
        /*0090*/                   I2F.S8 R7, R4 ;                         /* 0x0000000400077306 */
        /*00a0*/               @P0 BRA 0x70 ;                              /* 0xfffffffc00f00947 */
        /*00b0*/               @P2 BRA 0x10 ;                              /* 0xfffffffc00f02947 */
        /*00c0*/                   BRA 0xc0 ;                              /* 0xfffffffc00fc7947 */
"""

RES_FIXTURE = """
Resource usage:
 Common:
  GLOBAL:0 CONSTANT[3]:12
 Function _Z3fooi:
  REG:74 STACK:0 SHARED:1536 LOCAL:0 CONSTANT[0]:760 TEXTURE:0 SURFACE:0 SAMPLER:0
 Function _Z3bari:
  REG:128 STACK:472 SHARED:0 LOCAL:136 CONSTANT[0]:760 TEXTURE:0 SURFACE:0 SAMPLER:0
"""


@t.case
def sass_mix_finds_the_hot_loop():
    sys.path.insert(0, os.path.join(G.env()["source"], "bench"))
    import sass_mix  # noqa: E402
    funcs = sass_mix.parse(SASS_FIXTURE)
    G.check(len(funcs) == 1, "kernels read from the listing: %r", list(funcs))
    name, ins = next(iter(funcs.items()))
    G.check(name in ("foo(int)", "_Z3fooi") and len(ins) == 13, "the kernel %r, %d instructions",
            name, len(ins))
    body = sass_mix.hot_loop(ins)
    G.check(body == [t for a, t in ins if 0x70 <= a <= 0xa0], "the hot loop: %r", body)
    G.check(len(sass_mix.hot_loop([(a, x) for a, x in ins if a != 0x70 and a != 0x80])) == 4,
            "without the second loop's loads, the first loop: %r", ins)
    s = sass_mix.summary(body)
    G.check((s["instr"], s["LDG"], s["HMMA"], s["I2F"], s["I2FP"]) == (4, 2, 0, 1, 0), "its counts: %r", s)
    s = sass_mix.summary([t for a, t in ins if 0x30 <= a <= 0x60])
    G.check((s["instr"], s["LDG"], s["HMMA"], s["I2F"], s["I2FP"]) == (4, 1, 1, 0, 1), "the other loop's: %r", s)
    res = sass_mix.parse_resources(RES_FIXTURE)
    foo, bar = (res.get(n, res.get(m)) for n, m in (("foo(int)", "_Z3fooi"), ("bar(int)", "_Z3bari")))
    G.check(len(res) == 2 and foo == (74, 0, 0) and bar == (128, 472, 136),
            "registers, stack and local bytes per kernel: %r", res)


if __name__ == "__main__":
    t.main()
