#!/usr/bin/env python3
"""tests/integration/test_balancer.py — two orochi groups, each in its own network namespace (two
hosts on one machine), behind HAProxy configured by deploy/orochi-balance (ctest
integration_balancer, or `make test-lb` alone; root, network namespaces with veth pairs and haproxy
needed: without one of them it skips, saying which).

Each namespace gets a veth pair to the host (10.231.N.1 here, 10.231.N.2 there) and a group of one
worker started inside it with `ip netns exec` (the coordinator bound to 0.0.0.0). Checked:
  1. through the balancer, every answer equals the single-process greedy output (`orochi run`), and
     both groups serve (each one's orochi_requests_total grows);
  2. under load (8 clients, one request after another), every process of group A is killed with
     SIGKILL (`ip netns pids`: a host going down): only the requests in flight at that moment may
     fail (at most the clients' number), every request sent once the balancer's health checks
     have taken A out (2 checks of 250 ms, plus a second) is answered, at least 8 of them are (the
     load runs 6 s after the kill, then until 8 are, 60 s at most), and every answer is the
     reference;
  3. group A started again is put back by the health checks and serves again.
"""
import os
import shutil
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()
NS = ("oro-lb-a", "oro-lb-b")
PORT = 8000
CHECK_MS = 250
PROMPTS = ["The capital of France is", "List three colours:", "Once upon a time", "Water boils at"]
N_TOKENS = 24


def sh(*cmd, check=True):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if check and r.returncode:
        raise AssertionError("%s failed (%d): %s" % (" ".join(cmd), r.returncode, r.stderr.strip()))
    return r


def requirements():
    if os.geteuid() != 0:
        G.skip("network namespaces need root")
    if not shutil.which("haproxy"):
        G.skip("haproxy is not installed (Debian: apt-get install haproxy)")
    if not shutil.which("ip"):
        G.skip("the ip command (iproute2) is not installed")
    # what the test does, tried once: a namespace, a veth pair into it, a command run inside
    probe = [["ip", "netns", "add", "oro-lb-probe"],
             ["ip", "link", "add", "oro-pr-h", "type", "veth", "peer", "name", "oro-pr-n"],
             ["ip", "link", "set", "oro-pr-n", "netns", "oro-lb-probe"],
             ["ip", "netns", "exec", "oro-lb-probe", "ip", "link", "set", "lo", "up"]]
    why = None
    for cmd in probe:
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode:
            why = "%s: %s" % (" ".join(cmd), r.stderr.strip())
            break
    subprocess.run(["ip", "link", "del", "oro-pr-h"], capture_output=True)
    subprocess.run(["ip", "netns", "del", "oro-lb-probe"], capture_output=True)
    if why:
        G.skip("network namespaces with veth pairs are not available here (%s)" % why)


def ns_addr(i, side):
    return "10.231.%d.%d" % (i + 1, 1 if side == "host" else 2)


def ns_up():
    ns_down()
    for i, ns in enumerate(NS):
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", "%s-h" % ns[-4:], "type", "veth", "peer", "name", "%s-n" % ns[-4:])
        sh("ip", "link", "set", "%s-n" % ns[-4:], "netns", ns)
        sh("ip", "addr", "add", ns_addr(i, "host") + "/24", "dev", "%s-h" % ns[-4:])
        sh("ip", "link", "set", "%s-h" % ns[-4:], "up")
        sh("ip", "netns", "exec", ns, "ip", "addr", "add", ns_addr(i, "ns") + "/24", "dev", "%s-n" % ns[-4:])
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "%s-n" % ns[-4:], "up")
        sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")


def ns_kill(ns):
    pids = sh("ip", "netns", "pids", ns, check=False).stdout.split()
    for p in pids:
        try:
            os.kill(int(p), 9)
        except (ProcessLookupError, ValueError):
            pass
    return len(pids)


def ns_down():
    for ns in NS:
        if os.path.exists("/run/netns/" + ns):
            ns_kill(ns)
            sh("ip", "netns", "del", ns, check=False)
        sh("ip", "link", "del", "%s-h" % ns[-4:], check=False)


class NsGroup(G.Group):
    """A group inside network namespace ns, serving on ns's address."""

    def __init__(self, i, model):
        super().__init__("lb%d" % i, model, workers=1, extra=["--bind", "0.0.0.0"])
        self.ns, self.addr = NS[i], ns_addr(i, "ns")

    def launch_prefix(self):
        return ["ip", "netns", "exec", self.ns]

    def up(self):
        self.port = PORT
        G._LIVE_GROUPS.append(self)
        self.started = True
        self.launch(*self.up_args(), timeout=180)
        self.wait_healthy()
        return self

    @property
    def url(self):
        return "http://%s:%d" % (self.addr, self.port)


def requests_total(g):
    r = G.http(g.url + "/metrics", timeout=5)
    for line in r.body.decode().splitlines():
        if line.startswith("orochi_requests_total "):
            return int(line.split()[1])
    raise AssertionError("no orochi_requests_total in %s/metrics" % g.url)


def lb_ids(url, prompt):
    r = G.http(url + "/v1/completions", "POST",
               {"prompt": prompt, "max_tokens": N_TOKENS, "temperature": 0}, timeout=60)
    if r.status != 200:
        return None, "HTTP %d %s" % (r.status, r.body[:120])
    return r.json["orochi"]["token_ids"], None


@t.case
def balancer_spreads_and_survives_a_group_killed():
    requirements()
    model = G.default_model()
    want = {p: G.run_ids(model, p, N_TOKENS) for p in PROMPTS}
    lb_port = G.free_port()
    lb_url = "http://127.0.0.1:%d" % lb_port
    pidfile = os.path.join(G.env()["tmp"], "orochi-balance.pid")
    ns_up()
    try:
        with NsGroup(0, model) as a, NsGroup(1, model) as b:
            sh(os.path.join(G.env()["source"], "deploy", "orochi-balance"), "--listen", "127.0.0.1:%d" % lb_port,
               "--group", "%s:%d" % (a.addr, PORT), "--group", "%s:%d" % (b.addr, PORT),
               "--check-ms", str(CHECK_MS), "--pidfile", pidfile)
            try:
                deadline = time.time() + 20
                while time.time() < deadline and G.http(lb_url + "/health", timeout=2).status != 200:
                    time.sleep(0.2)
                # 1. spread, and the reference answers
                for k in range(12):
                    p = PROMPTS[k % len(PROMPTS)]
                    got, err = lb_ids(lb_url, p)
                    G.check(err is None, "request %d through the balancer: %s", k, err)
                    G.check_eq(got, want[p], "answer %d through the balancer" % k)
                na, nb = requests_total(a), requests_total(b)
                G.check(na > 0 and nb > 0, "one group served everything: A %d, B %d requests", na, nb)
                G.log("  12 answers through the balancer, all the reference: group A took %d, B %d" % (na, nb))

                # 2. group A's host goes down under load
                results, lock, stop = [], threading.Lock(), threading.Event()
                kill_at = [None]

                def client(ci):
                    k = 0
                    while not stop.is_set():
                        p = PROMPTS[(ci + k) % len(PROMPTS)]
                        t0 = time.time()
                        got, err = lb_ids(lb_url, p)
                        with lock:
                            results.append((t0, time.time(), p, got, err))
                        k += 1

                th = [threading.Thread(target=client, args=(ci,)) for ci in range(8)]
                for x in th:
                    x.start()
                time.sleep(3)
                kill_at[0] = time.time()
                killed = ns_kill(a.ns)
                a.started = False  # its processes are gone; `down` would find nothing
                # the load goes on 6 s, then until 8 requests sent after the checks took A out have
                # been answered (60 s at most: a slow build, ASan's, answers fewer a second)
                settled = kill_at[0] + 2 * CHECK_MS / 1e3 + 1.0
                time.sleep(6)
                deadline = time.time() + 60
                while time.time() < deadline:
                    with lock:
                        if sum(1 for r in results if r[0] > settled and r[4] is None) >= 8:
                            break
                    time.sleep(0.2)
                stop.set()
                for x in th:
                    x.join()
                failed = [r for r in results if r[4] is not None]
                wrong = [r for r in results if r[4] is None and r[3] != want[r[2]]]
                late_failed = [r for r in failed if r[0] > settled]
                G.check(not wrong, "%d answers differ from the reference", len(wrong))
                G.check(len(failed) <= 8, "%d requests failed (at most the 8 in flight may)", len(failed))
                G.check(not late_failed, "%d requests sent after the health checks took A out failed: %s",
                        len(late_failed), late_failed[:2])
                after = [r for r in results if r[0] > settled]
                G.check(len(after) >= 8, "only %d requests were answered after A went down", len(after))
                G.log("  A killed (%d processes) under load: %d answered, %d failed (in flight), %d answered "
                      "after the checks took A out, every answer the reference"
                      % (killed, len(results) - len(failed), len(failed), len(after)))

                # 3. A comes back
                a2 = NsGroup(0, model)
                a2.run_dir = a.run_dir
                a.launch("down", timeout=60, check=False)  # the arena a killed coordinator left
                with a2:
                    before = requests_total(a2)
                    deadline = time.time() + 30
                    served = 0
                    while time.time() < deadline and served == 0:
                        for p in PROMPTS:
                            got, err = lb_ids(lb_url, p)
                            G.check(err is None and got == want[p], "after A's return: %s", err)
                        served = requests_total(a2) - before
                    G.check(served > 0, "group A, started again, got no request in 30 s")
                    G.log("  A started again: back in the balancer, took %d requests" % served)
            finally:
                if os.path.exists(pidfile):
                    try:
                        os.kill(int(open(pidfile).read().split()[0]), 15)
                    except (ProcessLookupError, ValueError):
                        pass
    finally:
        ns_down()


if __name__ == "__main__":
    t.main()
