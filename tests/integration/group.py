"""Shared helpers for the integration tests: real process groups started with deploy/orochi-launch.

Every test file imports this module (it sits beside them). What it offers:

- `env()`: the paths ctest hands over (OROCHI_BIN, OROCHI_MODEL, OROCHI_SOURCE, OROCHI_TMP), with
  the directory of the binaries and the launcher derived from them;
- `skip(reason)`: print the reason and exit 77 (ctest's "skipped");
- `mkmodel(...)`: a tiny deterministic test model, cached in OROCHI_TMP/models by its shape;
- `run_ids(model, prompt, n)`: the reference, `orochi run --temp 0 --print-ids`;
- `Group`: one process group (`up` on a free port in a fresh run directory, HTTP helpers, the
  status file parsed, the role logs), always brought `down` on exit and dumping its logs when the
  test body fails; use it as a context manager;
- `Tests`: a minimal runner that runs named checks in order and exits 0 / 1 / 77.

Only the standard library is used, so the tests run with the system python3 and nothing else.
"""
import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
import urllib.error
import urllib.request

# ===== environment =====

_ENV = None


def env():
    """The test environment as a dict; skips the test when ctest did not provide it."""
    global _ENV
    if _ENV is not None:
        return _ENV
    bin_path = os.environ.get("OROCHI_BIN")
    source = os.environ.get("OROCHI_SOURCE")
    tmp = os.environ.get("OROCHI_TMP")
    if not bin_path or not source or not tmp:
        here = os.path.dirname(os.path.abspath(__file__))
        source = source or os.path.dirname(os.path.dirname(here))
        bin_path = bin_path or os.path.join(source, "build", "bin", "orochi")
        tmp = tmp or os.path.join("/tmp", "orochi-integration-%d" % os.getuid())
    bin_dir = os.path.dirname(os.path.abspath(bin_path))
    for exe in ("orochi", "orochi-coordinator", "orochi-worker", "orochi-speculator"):
        if not os.access(os.path.join(bin_dir, exe), os.X_OK):
            skip("%s is not built in %s" % (exe, bin_dir))
    launch = os.path.join(source, "deploy", "orochi-launch")
    if not os.access(launch, os.X_OK):
        skip("deploy/orochi-launch is missing or not executable")
    os.makedirs(tmp, exist_ok=True)
    _ENV = {
        "bin": os.path.join(bin_dir, "orochi"),
        "bin_dir": bin_dir,
        "source": source,
        "tmp": os.path.abspath(tmp),
        "model": os.environ.get("OROCHI_MODEL",
                                os.path.join(source, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")),
        "launch": launch,
    }
    return _ENV


def skip(reason):
    print("SKIP: %s" % reason, flush=True)
    sys.exit(77)


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def default_model():
    """Path of the default real model, or None when it is absent."""
    m = env()["model"]
    return m if m and os.path.isfile(m) else None


def free_port():
    """A TCP port nobody listens on right now (bind to 0, read it, close)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ===== models and the sequential reference =====

def mkmodel(layers=4, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=1,
            arch="llama"):
    """A deterministic random-weight model (arch: mkmodel's --arch, docs/models.md); files are
    cached by their shape, family and seed."""
    e = env()
    d = os.path.join(e["tmp"], "models")
    os.makedirs(d, exist_ok=True)
    name = "l%d-d%d-f%d-h%d-k%d-v%d-c%d-%s-s%d%s.gguf" % (layers, dim, ffn, heads, kv_heads, vocab, ctx,
                                                         type, seed, "" if arch == "llama" else "-" + arch)
    path = os.path.join(d, name)
    if not os.path.isfile(path):
        tmp = path + ".%d.tmp" % os.getpid()
        r = subprocess.run([e["bin"], "mkmodel", "--out", tmp, "--layers", str(layers), "--dim", str(dim),
                            "--ffn", str(ffn), "--heads", str(heads), "--kv-heads", str(kv_heads),
                            "--vocab", str(vocab), "--ctx", str(ctx), "--type", type, "--seed", str(seed),
                            "--arch", arch],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise AssertionError("orochi mkmodel failed (%d): %s" % (r.returncode, r.stderr.strip()))
        os.replace(tmp, path)
    return path


def write_plan(path, step_ms, width=4):
    """A plan (docs/speculation.md, "The plan") with one bucket of `width` and the step-time curve
    step_ms at widths 1, 2, 4, 8, 16: what prompt lookup in the free run weighs drafts against."""
    widths = [1, 2, 4, 8, 16]
    plan = {"orochi_plan": 1, "target": "test", "threads": 1, "act_bits": 0, "calibrated_on": "all",
            "buckets": [{"ctx": 100000, "width": width, "length": width - 1, "speculate": True}],
            "widths": widths, "curves": {"step_ms": {"100000": list(step_ms)}}}
    with open(path, "w") as f:
        json.dump(plan, f)
    return path


def built(name, why=""):
    """The path of program `name` in the build's bin directory; Skip (saying why it may be absent)
    when it was not built."""
    path = os.path.join(env()["bin_dir"], name)
    if not os.access(path, os.X_OK):
        raise Skip("%s is not built in %s%s" % (name, env()["bin_dir"], why))
    return path


def use_gpu_worker(name, why=""):
    """Make groups spawn program `name` for their GPU workers ($OROCHI_GPU_WORKER_BIN); its path."""
    path = built(name, why)
    os.environ["OROCHI_GPU_WORKER_BIN"] = path
    return path


def asan_build():
    """Whether the binaries under test are built with AddressSanitizer (make asan): several times
    slower, and their RSS grows by design (the quarantine keeps freed memory)."""
    with open(os.path.join(env()["bin_dir"], "orochi-coordinator"), "rb") as f:
        return b"__asan_init" in f.read()


def quantized(src, type_name):
    """src re-quantized by `orochi quantize` to type_name (a type or a preset); cached by name."""
    e = env()
    d = os.path.join(e["tmp"], "models")
    os.makedirs(d, exist_ok=True)
    path = os.path.join(d, "%s.%s.gguf" % (os.path.basename(src).rsplit(".", 1)[0], type_name))
    if not os.path.isfile(path):
        r = subprocess.run([e["bin"], "quantize", src, path, type_name], capture_output=True,
                           text=True, timeout=300)
        if r.returncode != 0:
            raise AssertionError("orochi quantize failed (%d): %s" % (r.returncode, r.stderr.strip()))
    return path


def run_ids(model, prompt, n, chat=False, extra=()):
    """The generated ids of `orochi run --temp 0 --print-ids` (eos included when it stops there);
    extra: more `orochi run` options."""
    cmd = [env()["bin"], "run", "--model", model, "--prompt", prompt, "-n", str(n), "--temp", "0",
           "--print-ids"] + list(extra)
    if chat:
        cmd.append("--chat")
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        raise AssertionError("orochi run failed (%d): %s" % (r.returncode, r.stderr.strip()))
    return [int(x) for x in r.stdout.split()]


# ===== HTTP =====

class HttpResult:
    """status, the raw body, and the body as JSON when it is JSON."""

    def __init__(self, status, body, headers=None):
        self.status = status
        self.body = body
        self.headers = headers or {}
        try:
            self.json = json.loads(body.decode("utf-8", "replace")) if body else None
        except ValueError:
            self.json = None

    def error_message(self):
        if isinstance(self.json, dict) and isinstance(self.json.get("error"), dict):
            return str(self.json["error"].get("message", ""))
        return ""

    def __repr__(self):
        return "HTTP %d %s" % (self.status, self.body[:400])


def http(url, method="GET", body=None, timeout=120, headers=None):
    """One HTTP exchange; `body` may be a dict (sent as JSON), bytes or str. Never raises on 4xx/5xx."""
    data = None
    h = dict(headers or {})
    if isinstance(body, (dict, list)):
        data = json.dumps(body).encode()
        h.setdefault("Content-Type", "application/json")
    elif isinstance(body, str):
        data = body.encode()
        h.setdefault("Content-Type", "application/json")
    elif body is not None:
        data = body
        h.setdefault("Content-Type", "application/json")
    req = urllib.request.Request(url, data=data, method=method, headers=h)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return HttpResult(resp.status, resp.read(), dict(resp.headers))
    except urllib.error.HTTPError as e:
        return HttpResult(e.code, e.read(), dict(e.headers or {}))


def sse_events(url, body, timeout=120, on_event=None):
    """POST a streaming request; returns the list of decoded `data:` JSON events (without [DONE]) and
    whether [DONE] was seen. on_event(event) is called for each as it arrives."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    events, done = [], False
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        ctype = resp.headers.get("Content-Type", "")
        if "text/event-stream" not in ctype:
            raise AssertionError("streaming answer has Content-Type %r" % ctype)
        for raw in resp:
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                done = True
                break
            ev = json.loads(payload)
            events.append(ev)
            if on_event:
                on_event(ev)
    return events, done


# ===== a process group =====

_LIVE_GROUPS = []
_SEQ = [0]


def _down_all():
    for g in list(_LIVE_GROUPS):
        try:
            g.down()
        except Exception:  # noqa: BLE001 - best effort at exit
            pass


atexit.register(_down_all)


def _on_term(signum, frame):
    _down_all()
    sys.exit(128 + signum)


for _sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
    try:
        signal.signal(_sig, _on_term)
    except (ValueError, OSError):
        pass


class Group:
    """One orochi process group: `with Group("name", target, ...) as g:` starts it, downs it after.

    speculators: list of launcher specs ("ngram", "layerskip:layers=0-1", "model:draft=PATH").
    extra: coordinator options after `--` (e.g. ["--n-ctx", "64"]).
    wait_speculators: after /health, wait until every speculator shows as connected in status.
    guard: leave the coordinator's fallback guard on. Off by default here: these tests check what
    drafts do (losslessness, acceptance), and the guard would rightly switch speculation off on
    tiny test models where drafting costs more than it saves.
    """

    def __init__(self, name, target, workers=2, speculators=(), threads=1, max_width=None,
                 max_draft=None, extra=(), wait_speculators=True, guard=False, launch_args=(),
                 devices=None):
        e = env()
        self.env = e
        _SEQ[0] += 1
        self.name = name
        leaf = "run-%s-%d-%d" % (name, os.getpid(), _SEQ[0])
        self.run_dir = os.path.join(e["tmp"], leaf)
        if len(self.run_dir) + len("/ctl") > 100:  # a unix socket path holds at most 107 bytes
            self.run_dir = os.path.join("/tmp", "orochi-it-%d" % os.getuid(), leaf)
        if os.path.isdir(self.run_dir):  # left over from an earlier run with the same pid
            subprocess.run(["rm", "-rf", self.run_dir], check=False)
        self.target = target
        # devices: the --workers list as DEVICE:N,... (e.g. "cpu:1,gpu:1"); workers counts them
        self.devices = devices or "cpu:%d" % workers
        self.workers = sum(int(d.split(":")[1]) for d in self.devices.split(","))
        self.speculators = list(speculators)
        self.threads = threads
        self.max_width = max_width
        self.launch_args = list(launch_args)  # more `orochi-launch up` options
        self.max_draft = max_draft
        self.extra = list(extra) + ([] if guard else ["--guard", "off"])
        self.wait_speculators = wait_speculators
        self.port = None
        self.started = False

    # --- launcher ---

    def launch(self, *args, timeout=60, check=True):
        """Run `orochi-launch ARGS --run-dir D`; returns the CompletedProcess."""
        cmd = self.launch_prefix() + [self.env["launch"]] + list(args) + ["--run-dir", self.run_dir]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.launch_env(),
                           stdin=subprocess.DEVNULL)
        if check and r.returncode != 0:
            raise AssertionError("orochi-launch %s failed (%d):\n%s%s" % (" ".join(args), r.returncode,
                                                                          r.stdout, r.stderr))
        return r

    def launch_prefix(self):
        """What the launcher runs under (e.g. `ip netns exec NS`): nothing here."""
        return []

    def launch_env(self):
        e = dict(os.environ)
        e["OROCHI_BIN_DIR"] = self.env["bin_dir"]
        e.pop("OROCHI_RUN_DIR", None)
        return e

    def up_args(self):
        args = ["up", "--port", str(self.port), "--target", self.target,
                "--workers", self.devices, "--threads-per-worker", str(self.threads)]
        for s in self.speculators:
            args += ["--speculator", s]
        if self.max_width:
            args += ["--max-width", str(self.max_width)]
        if self.max_draft:
            args += ["--max-draft", str(self.max_draft)]
        args += self.launch_args
        if self.extra:
            args += ["--"] + self.extra
        return args

    def up(self):
        for attempt in range(3):  # a port picked free may be taken by the time we bind it
            self.port = free_port()
            _LIVE_GROUPS.append(self)
            self.started = True
            r = self.launch(*self.up_args(), timeout=180, check=False)
            if r.returncode == 0:
                break
            coord_log = self.log("coordinator")
            if attempt < 2 and "address already in use" in (r.stderr + coord_log).lower():
                self.down()
                continue
            raise AssertionError("orochi-launch up failed (%d):\n%s%s" % (r.returncode, r.stdout, r.stderr))
        self.wait_healthy()
        if self.wait_speculators and self.speculators:
            n = len(self.speculators)
            self.wait_status(lambda st: sum(1 for v in st.values() if v.get("kind") and v["connected"]) >= n,
                             30, "%d speculators connected" % n)
        self.wait_status(lambda st: sum(1 for k, v in st.items() if k.startswith("worker-") and v["connected"])
                         == self.workers, 30, "all workers connected in status")
        return self

    def down(self):
        if not self.started:
            return
        self.started = False
        try:
            self.launch("down", timeout=60, check=False)
        finally:
            if self in _LIVE_GROUPS:
                _LIVE_GROUPS.remove(self)

    def __enter__(self):
        try:
            return self.up()
        except BaseException as e:
            if not isinstance(e, (SystemExit, Skip)) and self.started:
                self.dump_logs()
            self.down()
            raise

    def __exit__(self, etype, evalue, tb):
        if etype is not None and not issubclass(etype, (SystemExit, Skip)):
            self.dump_logs()
        self.down()
        return False

    # --- HTTP ---

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def http(self, path, method="GET", body=None, timeout=120):
        return http(self.url + path, method, body, timeout)

    def complete(self, prompt, max_tokens=32, temperature=0, **kw):
        """A non-streamed completion; asserts a 200 and returns the JSON answer."""
        timeout = kw.pop("timeout", 180)
        body = dict(prompt=prompt, max_tokens=max_tokens, temperature=temperature, **kw)
        r = self.http("/v1/completions", "POST", body, timeout=timeout)
        if r.status != 200 or not isinstance(r.json, dict):
            raise AssertionError("completion of %r failed: %r" % (prompt, r))
        return r.json

    def ids(self, prompt, max_tokens=32, **kw):
        return self.complete(prompt, max_tokens, **kw)["orochi"]["token_ids"]

    def healthy(self):
        try:
            return http(self.url + "/health", timeout=3).status == 200
        except (OSError, urllib.error.URLError):
            return False

    def wait_healthy(self, timeout=60):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.healthy():
                return
            time.sleep(0.1)
        raise AssertionError("group %s not healthy after %ds" % (self.name, timeout))

    # --- run directory ---

    def path(self, *parts):
        return os.path.join(self.run_dir, *parts)

    def status(self):
        """RUN_DIR/status parsed: {role: {pid, connected, restarts, steps, kind, line}}."""
        try:
            with open(self.path("status")) as f:
                lines = f.read().splitlines()
        except OSError:
            return {}
        return parse_status(lines)

    def send_held(self, calls, seconds):
        """Runs each of `calls` in a thread of its own while the workers are stopped (SIGSTOP),
        lets them go on (SIGCONT) `seconds` later, and waits for the threads: every request the
        calls send is in the group before its first step. A tiny model answers in milliseconds and
        a loaded machine may start client threads later than that; `seconds` must stay far inside
        --dead-ms (3 s)."""
        pids = [d["pid"] for r, d in self.status().items() if r.startswith("worker-") and d["pid"]]
        threads = [threading.Thread(target=f) for f in calls]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        try:
            for th in threads:
                th.start()
            time.sleep(seconds)
        finally:
            for pid in pids:
                os.kill(pid, signal.SIGCONT)
        for th in threads:
            th.join(180)

    def wait_status(self, pred, timeout, what):
        deadline = time.time() + timeout
        st = {}
        while time.time() < deadline:
            st = self.status()
            if st and pred(st):
                return st
            time.sleep(0.1)
        raise AssertionError("timed out after %ds waiting for %s; status:\n%s" % (
            timeout, what, "\n".join(v["line"] for v in st.values())))

    def coordinator_pid(self):
        with open(self.path("coordinator.pid")) as f:
            return int(f.read().strip())

    def log(self, role):
        try:
            with open(self.path("logs", role + ".log"), errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def wait_log(self, role, text, timeout=10):
        deadline = time.time() + timeout
        while time.time() < deadline:
            if text in self.log(role):
                return True
            time.sleep(0.1)
        raise AssertionError("%s.log never contained %r; it ends with:\n%s" % (
            role, text, self.log(role)[-2000:]))

    def dump_logs(self, tail=60):
        d = self.path("logs")
        print("----- logs of group %s (%s) -----" % (self.name, self.run_dir), flush=True)
        try:
            names = sorted(os.listdir(d))
        except OSError:
            names = []
        for n in names:
            with open(os.path.join(d, n), errors="replace") as f:
                lines = f.read().splitlines()
            print("=== %s (last %d of %d lines)" % (n, min(tail, len(lines)), len(lines)))
            for line in lines[-tail:]:
                print("  " + line)
        try:
            with open(self.path("status")) as f:
                print("=== status\n" + f.read())
        except OSError:
            pass
        sys.stdout.flush()


class Background:
    """A streamed greedy completion in a thread: .started is set at the first content chunk, so a
    test can disturb the group while the request is being generated; .result() is its ids."""

    def __init__(self, g, prompt, n):
        self.started = threading.Event()
        self.finished = threading.Event()
        self.events, self.done, self.error = [], False, None
        self.thread = threading.Thread(target=self._run, args=(g, prompt, n), daemon=True)
        self.thread.start()

    def _run(self, g, prompt, n):
        def on_event(ev):
            if ev.get("choices") and ev["choices"][0].get("text"):
                self.started.set()
        try:
            self.events, self.done = sse_events(g.url + "/v1/completions",
                                                  {"prompt": prompt, "max_tokens": n, "temperature": 0,
                                                   "stream": True}, timeout=300, on_event=on_event)
        except Exception as e:  # noqa: BLE001 - reported by result()
            self.error = e
        finally:
            self.started.set()
            self.finished.set()

    def wait_started(self, timeout=60):
        check(self.started.wait(timeout), "the request produced nothing in %ds", timeout)
        check(not self.finished.is_set(), "the request finished before anything could be killed "
                "(the model is too fast for this test): %r", self.error or self.events[-1:])

    def result(self, timeout=240):
        check(self.finished.wait(timeout), "the request did not finish in %ds", timeout)
        if self.error:
            raise AssertionError("the streamed request failed: %r" % (self.error,))
        check(self.done, "the stream ended without [DONE]")
        last = self.events[-1] if self.events else {}
        check("error" not in last, "the stream ended with an error: %r", last)
        check("orochi" in last, "the final chunk has no orochi object: %r", last)
        self.orochi = last["orochi"]
        return last["orochi"]["token_ids"]


def parse_status(lines):
    out = {}
    for line in lines:
        w = line.split()
        if len(w) < 3 or w[1] != "pid":
            continue
        role = w[0]
        d = {"line": line, "pid": None, "connected": False, "restarts": None, "steps": None, "kind": None}
        if w[2].isdigit():
            d["pid"] = int(w[2])
        d["connected"] = "not connected" not in line and d["pid"] is not None
        for i, tok in enumerate(w[:-1]):
            if tok == "restarts" and w[i + 1].isdigit():
                d["restarts"] = int(w[i + 1])
            elif tok == "steps" and w[i + 1].isdigit():
                d["steps"] = int(w[i + 1])
            elif tok == "kind":
                d["kind"] = w[i + 1]
        out[role] = d
    return out


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie counts as dead
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


# ===== a tiny runner =====

class Tests:
    """Register checks with @t.case, then t.main(): runs them in order, prints a line per check,
    exits 1 if any failed, 77 if all were skipped, else 0. A check skips by raising Skip."""

    def __init__(self):
        self.cases = []

    def case(self, fn):
        self.cases.append(fn)
        return fn

    def main(self):
        env()
        failed, skipped, t_all = [], [], time.time()
        only = set(sys.argv[1:])
        for fn in self.cases:
            if only and fn.__name__ not in only:
                continue
            t0 = time.time()
            log("RUN  %s" % fn.__name__)
            try:
                fn()
                log("PASS %s (%.1fs)" % (fn.__name__, time.time() - t0))
            except Skip as s:
                skipped.append(fn.__name__)
                log("SKIP %s: %s" % (fn.__name__, s))
            except Exception:  # noqa: BLE001 - report and go on with the other checks
                failed.append(fn.__name__)
                traceback.print_exc()
                sys.stdout.flush()
                log("FAIL %s (%.1fs)" % (fn.__name__, time.time() - t0))
            finally:
                _down_all()
        ran = len(self.cases) if not only else len(only)
        log("%d checks: %d passed, %d failed, %d skipped in %.1fs" % (
            ran, ran - len(failed) - len(skipped), len(failed), len(skipped), time.time() - t_all))
        if failed:
            log("FAILED: %s" % ", ".join(failed))
            sys.exit(1)
        if skipped and len(skipped) == ran:
            sys.exit(77)
        sys.exit(0)


class Skip(Exception):
    pass


def check(cond, msg, *args):
    if not cond:
        raise AssertionError(msg % args if args else msg)


def check_eq(got, want, what):
    if got != want:
        first = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), min(len(got), len(want))) \
            if isinstance(got, list) and isinstance(want, list) else None
        raise AssertionError("%s differs%s:\n  got  %r\n  want %r" % (
            what, "" if first is None else " (first at index %d)" % first, got, want))
