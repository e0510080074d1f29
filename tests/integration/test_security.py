"""Limits and access (docs/security.md): where the API key comes from and who can see it, the run
directory's permissions, and the queue limit.

- `orochi-launch up --api-key K` keeps the key off every command line: it goes into RUN_DIR/api-key
  (mode 0600) and the coordinator reads it with --api-key-file; RUN_DIR is 0700. A request without
  the key is refused with 401, with it answered.
- `--api-key-file F` and $OROCHI_API_KEY give the key just as well; an empty key file is refused at
  start with a message naming it.
- With --max-queue 1 and one sequence slot, requests beyond the one running and the one waiting
  get 429 with Retry-After, the admitted ones still finish, and the group serves again after.
"""
import os
import stat
import subprocess
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()
BODY = {"prompt": "hello world", "max_tokens": 8, "temperature": 0}


def tiny():
    return G.mkmodel(layers=2, dim=64, ffn=128, heads=2, kv_heads=2, vocab=300, ctx=256, type="f32",
                     seed=21)


def with_key(g, key):
    return G.http(g.url + "/v1/completions", "POST", BODY, timeout=60,
                  headers={"Authorization": "Bearer " + key})


def check_key_works(g, key, what):
    r = g.http("/v1/completions", "POST", BODY, timeout=60)
    G.check(r.status == 401, "%s: a request without the key got %r", what, r)
    G.check(with_key(g, "wrong-" + key).status == 401, "%s: a wrong key was accepted", what)
    r = with_key(g, key)
    G.check(r.status == 200, "%s: a request with the key got %r", what, r)


@t.case
def test_security_api_key_off_the_command_line():
    key = "sk-orochi-test-7f3a"
    with G.Group("sec-key", tiny(), launch_args=["--api-key", key]) as g:
        check_key_works(g, key, "--api-key")
        mode = stat.S_IMODE(os.stat(g.run_dir).st_mode)
        G.check(mode == 0o700, "run dir mode %o, expected 700", mode)
        kf = os.path.join(g.run_dir, "api-key")
        G.check(os.path.isfile(kf) and stat.S_IMODE(os.stat(kf).st_mode) == 0o600,
                "RUN_DIR/api-key missing or not 0600")
        with open("/proc/%d/cmdline" % g.coordinator_pid(), "rb") as f:
            argv = f.read()
        G.check(key.encode() not in argv, "the key is on the coordinator's command line: %r", argv)
        G.check(b"--api-key-file" in argv, "the coordinator was not given --api-key-file: %r", argv)


@t.case
def test_security_api_key_from_file_and_environment():
    key = "from-a-file-123"
    path = os.path.join(G.env()["tmp"], "key.txt")
    with open(path, "w") as f:
        f.write(key + "\n")
    with G.Group("sec-keyfile", tiny(), extra=["--api-key-file", path]) as g:
        check_key_works(g, key, "--api-key-file")
    os.environ["OROCHI_API_KEY"] = "from-the-environment-456"
    try:
        with G.Group("sec-keyenv", tiny()) as g:
            check_key_works(g, "from-the-environment-456", "$OROCHI_API_KEY")
    finally:
        del os.environ["OROCHI_API_KEY"]
    empty = os.path.join(G.env()["tmp"], "empty-key.txt")
    open(empty, "w").close()
    r = subprocess.run([os.path.join(G.env()["bin_dir"], "orochi-coordinator"), "--run-dir",
                        os.path.join(G.env()["tmp"], "sec-empty"), "--target", tiny(),
                        "--api-key-file", empty], capture_output=True, text=True, timeout=60)
    G.check(r.returncode == 2 and "--api-key-file %s: empty" % empty in r.stderr,
            "an empty key file: exit %d, %r", r.returncode, r.stderr)


@t.case
def test_security_queue_limit_429():
    model = G.mkmodel(layers=8, dim=512, ffn=1536, heads=8, kv_heads=8, vocab=300, ctx=512,
                      type="f32", seed=22)
    with G.Group("sec-queue", model, workers=1, extra=["--max-queue", "1", "--max-batch", "1"]) as g:
        results = []

        def one():
            results.append(g.http("/v1/completions", "POST",
                                  {"prompt": "hello", "max_tokens": 64, "temperature": 0},
                                  timeout=120))

        threads = [threading.Thread(target=one) for _ in range(6)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        codes = sorted(r.status for r in results)
        G.log("  6 concurrent requests, --max-queue 1 --max-batch 1: statuses %s" % codes)
        limited = [r for r in results if r.status == 429]
        G.check(limited, "no request was refused with 429: %s", codes)
        G.check(all(r.status in (200, 429) for r in results), "statuses %s", codes)
        # one or two are admitted (the first may leave the queue for its slot before the rest
        # arrive), and every admitted one finishes
        G.check(codes.count(200) >= 1, "no request served: %s", codes)
        r = limited[0]
        G.check(r.headers.get("Retry-After") == "1" and r.json["error"]["type"] == "rate_limit_error"
                and "--max-queue" in r.error_message(), "the 429: %r %r", r.headers, r.body)
        r = g.http("/v1/completions", "POST", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
        G.check(r.status == 200, "a request after the burst: %r", r)


if __name__ == "__main__":
    t.main()
