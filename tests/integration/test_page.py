"""The page at `/` in headless Chromium: it loads, a chat streams, the dashboard lists the group.

A group on the default model (two workers and the ngram speculator) serves the page
(coordinator/page/index.html, compiled into the coordinator). The test drives Debian's `chromium`
through the DevTools protocol over --remote-debugging-pipe (JSON messages on two pipes, so only
the standard library is needed) and checks:

- the page: `GET /` answers the repository's file byte for byte, as text/html with a policy that
  keeps it to its own origin, and it refers to nothing outside itself; in the browser it runs
  without an error or a console complaint (a blocked resource would be one);
- the chat: a message typed into the page and sent with temperature 0 streams an answer (several
  chunks, the text growing) equal to what a direct, non-streamed greedy call of
  /v1/chat/completions gives for the same messages; a second turn carries the conversation;
- the dashboard: its table has one row per process of the group with the pid the status file
  gives (coordinator, both workers, the speculator), the tiles show the width and the
  speculation length /status reports, and the timeline has drawn the chat's steps;
- with an API key the page still loads (a browser cannot send a key when it opens a URL), /status
  wants the key, and the dashboard fills in once the key is typed into the page.

Screenshots of the chat and the dashboard are written to OROCHI_TMP/page-shots, or to
$OROCHI_PAGE_SHOTS when set (docs/page.md's images: OROCHI_PAGE_SHOTS=docs/img).

Without Chromium the test is skipped and says so (deploy/install-deps.sh installs it); without the
default model too.
"""
import base64
import fcntl
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()


def chromium_path():
    for name in (os.environ.get("OROCHI_CHROMIUM"), "chromium", "chromium-browser"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


if not chromium_path():
    G.skip("Chromium is not installed (Debian package `chromium`, which deploy/install-deps.sh "
           "installs; or set OROCHI_CHROMIUM to a Chromium binary): the page is not tested")


# ===== Chromium over the DevTools protocol =====

class Browser:
    """A headless Chromium driven through --remote-debugging-pipe: the browser reads commands from
    its fd 3 and writes answers and events to its fd 4, each message JSON ended by a NUL byte."""

    def __init__(self, width=1400, height=900):
        self.profile = tempfile.mkdtemp(prefix="chromium-", dir=G.env()["tmp"])
        to_child, self.cmd_w = os.pipe()
        self.evt_r, from_child = os.pipe()

        def child_fds():
            # to fds 3 and 4 by way of high numbers, so that neither dup2 clobbers the other
            a = fcntl.fcntl(to_child, fcntl.F_DUPFD, 10)
            b = fcntl.fcntl(from_child, fcntl.F_DUPFD, 10)
            os.dup2(a, 3)
            os.dup2(b, 4)

        # --no-sandbox: Chromium's sandbox refuses to start as root and needs user namespaces,
        # which containers often lack; the only page it opens is the group's own, on 127.0.0.1
        args = [chromium_path(), "--headless", "--remote-debugging-pipe", "--no-sandbox",
                "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
                "--no-default-browser-check", "--hide-scrollbars", "--force-device-scale-factor=1",
                "--window-size=%d,%d" % (width, height), "--user-data-dir=" + self.profile,
                "about:blank"]
        self.log_path = os.path.join(self.profile, "chromium.log")
        with open(self.log_path, "w") as logf:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                         close_fds=False, preexec_fn=child_fds)
        os.close(to_child)
        os.close(from_child)
        self.buf = b""
        self.next_id = 0
        self.events = []
        self.session = None

    def _read_message(self, deadline):
        while b"\0" not in self.buf:
            left = deadline - time.time()
            if left <= 0 or not select.select([self.evt_r], [], [], left)[0]:
                raise AssertionError("Chromium did not answer in time; its log ends with:\n" +
                                     self.log_tail())
            chunk = os.read(self.evt_r, 1 << 16)
            if not chunk:
                raise AssertionError("Chromium closed its pipe; its log ends with:\n" + self.log_tail())
            self.buf += chunk
        msg, self.buf = self.buf.split(b"\0", 1)
        return json.loads(msg)

    def send(self, method, params=None, session=True, timeout=30):
        """One command; its result (an error answer raises). session: to the attached page."""
        self.next_id += 1
        m = {"id": self.next_id, "method": method, "params": params or {}}
        if session and self.session:
            m["sessionId"] = self.session
        os.write(self.cmd_w, json.dumps(m).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            r = self._read_message(deadline)
            if r.get("id") == self.next_id:
                if "error" in r:
                    raise AssertionError("DevTools %s failed: %r" % (method, r["error"]))
                return r.get("result", {})
            if "method" in r:
                self.events.append(r)

    def open(self, url):
        """A new tab on url, attached; waits for the document to load."""
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=False)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=False)["sessionId"]
        for domain in ("Runtime", "Log", "Page"):
            self.send(domain + ".enable")
        self.send("Page.navigate", {"url": url})
        self.wait_for("document.readyState === 'complete' && location.href === %s" % json.dumps(url),
                      20, "the page to load")

    def eval(self, expr):
        """The value of a JavaScript expression in the page (promises awaited)."""
        r = self.send("Runtime.evaluate", {"expression": expr, "returnByValue": True,
                                           "awaitPromise": True})
        if "exceptionDetails" in r:
            raise AssertionError("%s threw: %r" % (expr, r["exceptionDetails"]))
        return r["result"].get("value")

    def wait_for(self, expr, timeout, what, every=0.05):
        deadline = time.time() + timeout
        while time.time() < deadline:
            v = self.eval(expr)
            if v:
                return v
            time.sleep(every)
        raise AssertionError("timed out after %ds waiting for %s (%s)" % (timeout, what, expr))

    def problems(self):
        """Exceptions the page threw and errors it logged (a CSP violation or a resource that did
        not load is one), as text."""
        out = []
        for e in self.events:
            if e["method"] == "Runtime.exceptionThrown":
                d = e["params"]["exceptionDetails"]
                out.append("exception: %s" % d.get("exception", {}).get("description", d.get("text")))
            elif e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"):
                out.append("console.%s: %r" % (e["params"]["type"], e["params"]["args"]))
            elif e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error":
                out.append("log: %s (%s)" % (e["params"]["entry"]["text"], e["params"]["entry"].get("url")))
        return out

    def screenshot(self, selector, path):
        """A PNG of the element selector matches, written to path."""
        rect = self.eval("(() => { const r = document.querySelector(%s).getBoundingClientRect(); "
                         "return {x: r.x, y: r.y, width: r.width, height: r.height}; })()"
                         % json.dumps(selector))
        G.check(rect["width"] > 100 and rect["height"] > 100, "%s is not on the page: %r", selector, rect)
        shot = self.send("Page.captureScreenshot", {"format": "png", "clip": dict(rect, scale=1)})
        data = base64.b64decode(shot["data"])
        G.check(data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000, "the screenshot of %s is no PNG "
                "(%d bytes)", selector, len(data))
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        with open(path, "wb") as f:
            f.write(data)
        G.log("  screenshot of %s: %s (%d bytes)" % (selector, path, len(data)))

    def log_tail(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-2000:]
        except OSError:
            return "(no log)"

    def close(self):
        try:
            self.send("Browser.close", session=False, timeout=5)
        except (AssertionError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self.cmd_w)
        os.close(self.evt_r)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


# ===== helpers =====

def model():
    m = G.default_model()
    if not m:
        raise G.Skip("the default model is absent (make models)")
    return m


def shots_dir():
    d = os.environ.get("OROCHI_PAGE_SHOTS")
    return os.path.abspath(d) if d else os.path.join(G.env()["tmp"], "page-shots")


def greedy_chat(g, messages, max_tokens):
    r = g.http("/v1/chat/completions", "POST", {"messages": messages, "max_tokens": max_tokens,
                                                 "temperature": 0})
    G.check(r.status == 200, "the direct chat call failed: %r", r)
    return r.json["choices"][0]["message"]["content"]


def page_send(b, text, max_tokens):
    """Types text into the page's message box with temperature 0 and sends it; waits for the
    answer, watching it grow. Returns (answer text, chunks, lengths seen while streaming)."""
    n = b.eval("document.querySelectorAll('.msg.assistant').length")
    b.eval("document.getElementById('temp').value = '0'; "
           "document.getElementById('maxtok').value = '%d'; "
           "document.getElementById('msg').focus()" % max_tokens)
    b.send("Input.insertText", {"text": text})
    b.eval("document.getElementById('send').click()")
    last = "document.querySelectorAll('.msg.assistant')[%d]" % n
    b.wait_for("!!" + last, 10, "the answer's bubble")
    seen, deadline = set(), time.time() + 180
    while time.time() < deadline:
        st = b.eval("(() => { const e = %s; return {state: e.dataset.state, chunks: +e.dataset.chunks, "
                    "len: e.querySelector('.text').textContent.length}; })()" % last)
        if st["state"] != "streaming":
            break
        seen.add(st["len"])
        time.sleep(0.02)
    st = b.eval("(() => { const e = %s; return {state: e.dataset.state, chunks: +e.dataset.chunks, "
                "text: e.querySelector('.text').textContent, "
                "stats: (e.querySelector('.stats') || {}).textContent}; })()" % last)
    G.check(st["state"] == "done", "the answer did not end well: %r", st)
    G.log("  page answer (%d chunks; %s): %r" % (st["chunks"], st["stats"], st["text"][:120]))
    return st["text"], st["chunks"], seen, st["stats"]


# ===== checks =====

@t.case
def test_page_chat_and_dashboard():
    m = model()
    with G.Group("page", m, workers=2, speculators=["ngram"]) as g, Browser(1600, 900) as b:
        # the page as served: the repository's file, HTML, kept to its own origin
        r = G.http(g.url + "/")
        with open(os.path.join(G.env()["source"], "coordinator", "page", "index.html"), "rb") as f:
            G.check(r.body == f.read(), "GET / is not coordinator/page/index.html (%d bytes)", len(r.body))
        G.check(r.status == 200 and r.headers.get("Content-Type", "").startswith("text/html"),
                "GET /: %r %r", r.status, r.headers)
        csp = r.headers.get("Content-Security-Policy", "")
        G.check("default-src 'none'" in csp and "connect-src 'self'" in csp, "GET /: policy %r", csp)
        G.check(b"://" not in r.body, "the page refers to something outside itself")

        b.open(g.url + "/")
        G.check(b.eval("document.title") == "orochi", "title %r", b.eval("document.title"))
        b.wait_for("+document.body.dataset.polls >= 2", 15, "the dashboard's first answers")

        # the chat: the answer streams and equals the greedy answer of the API
        q1, n = "List the numbers from 1 to 30, separated by commas.", 128
        text, chunks, seen, stats = page_send(b, q1, n)
        want = greedy_chat(g, [{"role": "user", "content": q1}], n)
        G.check_eq(text, want, "the page's answer against the API's greedy answer")
        G.check(chunks >= 2, "the answer came in %d chunk(s): not streamed", chunks)
        G.check(any(0 < k < len(text) for k in seen), "the answer never showed part of its text "
                "while streaming (lengths seen: %r)", sorted(seen))
        G.check("tokens" in stats and "steps" in stats, "no statistics under the answer: %r", stats)
        q2 = "Now only the even ones."
        text2, _, _, _ = page_send(b, q2, 64)
        want2 = greedy_chat(g, [{"role": "user", "content": q1}, {"role": "assistant", "content": text},
                                {"role": "user", "content": q2}], 64)
        G.check_eq(text2, want2, "the second turn against the API with the whole conversation")

        # the dashboard: every process of the status file, with its pid
        status = g.status()
        G.check({"coordinator", "worker-0", "worker-1", "ngram"} <= set(status), "status file: %r",
                sorted(status))
        pids = {name: v["pid"] for name, v in status.items()}
        polls = int(b.eval("document.body.dataset.polls"))
        b.wait_for("+document.body.dataset.polls >= %d" % (polls + 2), 10, "two more dashboard answers")
        rows = b.eval("[...document.querySelectorAll('#procs tr')].map(r => "
                      "({name: r.dataset.name, pid: +r.dataset.pid, "
                      "cells: [...r.cells].map(c => c.textContent)}))")
        G.log("  dashboard rows: %s" % "; ".join(" ".join(r["cells"]) for r in rows))
        G.check_eq(sorted(r["name"] for r in rows), sorted(pids), "the dashboard's processes")
        for r in rows:
            G.check(r["pid"] == pids[r["name"]], "%s: pid %r on the page, %r in the status file",
                    r["name"], r["pid"], pids[r["name"]])
        spec = next(r for r in rows if r["name"] == "ngram")
        G.check(any("ngram" in c for c in spec["cells"]) and any(c.endswith("%") for c in spec["cells"]),
                "the speculator's row has no kind or acceptance: %r", spec["cells"])
        # each process's memory: the coordinator reads it every 10 s
        b.wait_for("[...document.querySelectorAll('#procs tr')].every(r => [...r.cells].some(c => "
                   "c.title.startsWith('proportional set size')))", 15, "every process's memory")
        js = g.http("/status").json
        G.check(b.eval("document.getElementById('f-width').textContent") == str(js["controllers"]["width"]),
                "the width tile says %r, /status %r", b.eval("document.getElementById('f-width').textContent"),
                js["controllers"]["width"])
        G.check(b.eval("document.getElementById('f-len').textContent") ==
                str(js["controllers"]["speculation_length"]), "the speculation length tile differs from /status")
        G.check(b.eval("seen.samples.some(s => s.tps >= 1)"), "the tiles saw none of the chat's steps")
        # the step timeline: one bar per cycle /status lists, none twice
        G.check(js["recent_steps"] and b.eval("seen.steps.length") > 0 and
                b.eval("seen.steps.length") <= len(js["recent_steps"]) + 64 and
                b.eval("seen.steps.every(s => s.tps >= 1 && s.requests >= 1)"),
                "the step timeline: %r bars for %d listed cycles", b.eval("seen.steps.length"),
                len(js["recent_steps"]))

        # the pictures, taken while another client's request runs, so that the dashboard moves:
        # a sampled one, verified step by step, so the speculator's acceptance is measured too
        other = {}

        def sampled():
            try:
                other["events"], other["done"] = G.sse_events(
                    g.url + "/v1/completions", {"prompt": "Count from 1 to 300: 1, 2, 3,", "max_tokens": 400,
                                                "temperature": 0.5, "seed": 7, "stream": True}, timeout=300)
            except Exception as e:  # noqa: BLE001 - reported below
                other["error"] = e
        th = threading.Thread(target=sampled, daemon=True)
        th.start()
        for expr, what in (("+document.getElementById('f-rate').textContent > 0", "a moving dashboard"),
                           ("[...document.querySelector('#procs tr[data-name=ngram]').cells].some(c => "
                            "/^[1-9][0-9.]* %$/.test(c.textContent))", "the speculator's acceptance")):
            try:  # for the picture only
                b.wait_for(expr, 10, what)
            except AssertionError:
                G.log("  (the request ended before the dashboard showed %s)" % what)
        b.screenshot("#chat", os.path.join(shots_dir(), "page-chat.png"))
        b.screenshot("#group", os.path.join(shots_dir(), "page-dashboard.png"))
        th.join(300)
        G.check(other.get("done"), "the other client's request failed: %r", other.get("error"))
        problems = b.problems()
        G.check(not problems, "the page had trouble:\n  %s", "\n  ".join(problems))


@t.case
def test_page_with_api_key():
    m = model()
    key = "page-test-key"
    with G.Group("page-key", m, workers=1, launch_args=["--api-key", key]) as g, Browser() as b:
        G.check(G.http(g.url + "/").status == 200, "GET / wants a key: the page could never load")
        G.check(G.http(g.url + "/status").status == 401, "GET /status without the key is not 401")
        r = G.http(g.url + "/status", headers={"Authorization": "Bearer " + key})
        G.check(r.status == 200 and r.json["object"] == "orochi.status", "/status with the key: %r", r)
        b.open(g.url + "/")
        b.wait_for("document.getElementById('notice').textContent.includes('API key')", 10,
                   "the page to ask for the key")
        b.eval("(() => { const k = document.getElementById('key'); k.value = %s; "
               "k.dispatchEvent(new Event('change')); })()" % json.dumps(key))
        b.wait_for("document.querySelectorAll('#procs tr').length >= 2", 10,
                   "the dashboard with the key")
        names = b.eval("[...document.querySelectorAll('#procs tr')].map(r => r.dataset.name)")
        G.check_eq(sorted(names), ["coordinator", "worker-0"], "the dashboard's processes")


if __name__ == "__main__":
    t.main()
