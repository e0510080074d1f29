#!/usr/bin/env python3
"""The machine code of the GPU matmul kernels, counted without a GPU: for each kernel of a CUDA
object (the build's kcuda_matmul.cu.o), the instructions of its hot loop — the innermost
backward branch whose body holds the most loads from global memory — by opcode, with its loads
(LDG), tensor-core products (HMMA) and integer-to-float conversions (I2F: the conversion pipe;
I2FP: the float pipe), and its registers a thread with its stack frame, where spilled registers
go, if it has one (cuobjdump -res-usage). Where a kernel issues more instructions than its loads
can hide, these counts are its time; bench/gpu-profile.sh's issue share on a GPU says whether it
does.

    bench/sass_mix.py OBJECT [OBJECT...] [--kernel REGEX]

With two objects (before and after a change), each kernel's counts side by side. It runs the CUDA
toolkit's cuobjdump with nvdisasm: from the PATH, /usr/local/cuda/bin, or the PyPI packages
nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm (pip install them; their bin folders are found).
"""
import collections
import glob
import os
import re
import shutil
import subprocess
import sys

DEFAULT_KERNELS = r"k_mma<12u, 0, (1|8), |k_matmul<12u, 0, 2>|k_mma<(8|14)u, 0, 1, "


def tool(name):
    """The path of a CUDA binary tool, or None."""
    found = shutil.which(name)
    if found:
        return found
    cands = ["/usr/local/cuda/bin/" + name]
    for site in sys.path:
        cands += glob.glob(os.path.join(site, "nvidia", "cu*", "bin", name))
    return next((c for c in cands if os.access(c, os.X_OK)), None)


def sass(path):
    """{demangled kernel name: [(address, instruction)]} of an object's sm_XX code."""
    cuobjdump, nvdisasm = tool("cuobjdump"), tool("nvdisasm")
    if not cuobjdump or not nvdisasm:
        sys.exit("sass_mix: needs cuobjdump and nvdisasm (the CUDA toolkit's, or pip install "
                 "nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)")
    env = dict(os.environ, NVDISASM_PATH=os.path.dirname(nvdisasm))
    env["PATH"] = os.path.dirname(nvdisasm) + os.pathsep + env.get("PATH", "")
    r = subprocess.run([cuobjdump, "-sass", path], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("sass_mix: cuobjdump %s: %s" % (path, r.stderr.strip()[-500:]))
    return parse(r.stdout)


def resources(path):
    """{demangled kernel name: (registers, stack bytes, local bytes)} of an object (cuobjdump
    -res-usage; ptxas puts spilled registers in the stack frame, STACK, not in LOCAL); {} where
    cuobjdump cannot say."""
    cuobjdump = tool("cuobjdump")
    r = subprocess.run([cuobjdump, "-res-usage", path], capture_output=True, text=True)
    return parse_resources(r.stdout) if r.returncode == 0 else {}


def parse_resources(text):
    res, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"^\s*Function (\S+?):?\s*$", line)
        if m:
            cur = m.group(1)
            continue
        m = re.search(r"\bREG:(\d+)\b.*\bSTACK:(\d+)\b.*\bLOCAL:(\d+)", line)
        if cur and m:
            res[cur] = (int(m.group(1)), int(m.group(2)), int(m.group(3)))
            cur = None
    names = demangle(list(res))
    return {names.get(k, k): v for k, v in res.items()}


def parse(text):
    funcs, cur, mangled = {}, None, []
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = m.group(1)
            mangled.append(cur)
            funcs[cur] = []
            continue
        m = re.match(r"^\s+/\*([0-9a-f]+)\*/\s+(.*?);", line)
        if cur and m:
            funcs[cur].append((int(m.group(1), 16), m.group(2).strip()))
    names = demangle(mangled)
    return {names.get(k, k): v for k, v in funcs.items()}


def demangle(names):
    if not names or not shutil.which("c++filt"):
        return {}
    r = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
    return dict(zip(names, r.stdout.splitlines()))


def opcode(ins):
    """The opcode of an instruction, without its predicate and modifiers."""
    return re.sub(r"^@!?U?P\w+\s+", "", ins).split()[0].split(".")[0]


def hot_loop(ins):
    """The body of the innermost loop holding the most global loads ([] without a loop): of the
    backward branches whose body loads, those that enclose no other such loop (a kernel's pass
    loop around its loop over the weights would count the reduction and the tail with it)."""
    loops = []
    for addr, text in ins:
        m = re.search(r"\bBRA (0x[0-9a-f]+)", text)
        if m and int(m.group(1), 16) < addr:
            top = int(m.group(1), 16)
            body = [t for a, t in ins if top <= a <= addr]
            loads = sum(opcode(t) == "LDG" for t in body)
            if loads:
                loops.append((top, addr, loads, body))
    inner = [l for l in loops
             if not any(o is not l and l[0] <= o[0] and o[1] <= l[1] for o in loops)]
    return max(inner, key=lambda l: l[2], default=(0, 0, 0, []))[3]


def summary(body):
    ops = collections.Counter(opcode(t) for t in body)
    return {"instr": len(body), "LDG": ops["LDG"], "HMMA": ops["HMMA"], "I2F": ops["I2F"],
            "I2FP": ops["I2FP"], "top": ops.most_common(5)}


def main():
    args = sys.argv[1:]
    pattern = DEFAULT_KERNELS
    if "--kernel" in args:
        i = args.index("--kernel")
        pattern = args[i + 1]
        del args[i:i + 2]
    if not args:
        sys.exit("usage: sass_mix.py OBJECT [OBJECT...] [--kernel REGEX]")
    objs = [sass(p) for p in args]
    regs = [resources(p) for p in args]
    names = sorted(k for k in objs[0] if re.search(pattern, k))
    if not names:
        sys.exit("sass_mix: no kernel of %s matches %r" % (args[0], pattern))
    print("hot loop of each kernel: instructions (LDG loads, HMMA products, I2F/I2FP conversions)"
          "; the kernel's registers a thread (and its stack: spills)")
    for name in names:
        cols = []
        for o, rg in zip(objs, regs):
            if name not in o:
                cols.append("absent")
                continue
            s = summary(hot_loop(o[name]))
            reg, stack, local = rg.get(name, (None, 0, 0))
            cols.append("%5d (LDG %d, HMMA %d, I2F %d/%d) %s%s%s%s" % (
                s["instr"], s["LDG"], s["HMMA"], s["I2F"], s["I2FP"],
                " ".join("%s %d" % kv for kv in s["top"]),
                "" if reg is None else "; %d registers" % reg,
                ", %d stack bytes" % stack if stack else "",
                ", %d local bytes" % local if local else ""))
        print(name)
        for path, c in zip(args, cols):
            print("  %s%s" % ("%s: " % path[-40:] if len(args) > 1 else "", c))


if __name__ == "__main__":
    main()
