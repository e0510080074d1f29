"""The control socket survives malformed frames and peers speaking another protocol version.

The coordinator's ROUTER socket is the unix socket RUN_DIR/ctl (ipc://). Python's zmq module is
not available here, so this test speaks ZMTP 3.0 itself: the 64-byte greeting with the NULL
mechanism, a READY command announcing a DEALER socket, then message frames. Over that connection
it sends garbage, an oversized frame, an empty frame, envelopes without a body, an envelope of
protocol version 999, Hellos the coordinator must refuse, and a message from a peer that never said
Hello. The coordinator must log each bad frame ("ignoring a bad frame: ..."), answer the wrong
version and the refused Hellos with an Error envelope, stay alive with its workers connected, and
still serve a completion identical to the one before.
"""
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import group as G  # noqa: E402

t = G.Tests()



def protocol_version():
    """OROCHI_PROTOCOL_VERSION from group/runtime.h: the version this build speaks."""
    path = os.path.join(G.env()["source"], "group", "runtime.h")
    with open(path) as f:
        for line in f:
            w = line.split()
            if len(w) >= 3 and w[0] == "#define" and w[1] == "OROCHI_PROTOCOL_VERSION":
                return int(w[2])
    raise AssertionError("no OROCHI_PROTOCOL_VERSION in %s" % path)


PROTOCOL_VERSION = protocol_version()


# ===== protobuf, by hand (only what these messages need) =====

def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field_varint(num, v):
    return varint(num << 3 | 0) + varint(v)


def field_bytes(num, b):
    if isinstance(b, str):
        b = b.encode()
    return varint(num << 3 | 2) + varint(len(b)) + b


def envelope(version, body_field=None, body=b""):
    out = field_varint(1, version)
    if body_field is not None:
        out += field_bytes(body_field, body)
    return out


def parse_fields(buf):
    """{field number: [values]} of a protobuf message (varints as int, length-delimited as bytes)."""
    out, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wt = key >> 3, key & 7
        if wt == 0:
            v, i = read_varint(buf, i)
        elif wt == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        elif wt == 1:
            v, i = buf[i:i + 8], i + 8
        elif wt == 5:
            v, i = buf[i:i + 4], i + 4
        else:
            raise ValueError("wire type %d" % wt)
        out.setdefault(num, []).append(v)
    return out


def read_varint(buf, i):
    n, shift = 0, 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


# Envelope body fields (proto/orochi.proto)
HELLO, STEP_DONE, HEARTBEAT, ERROR = 2, 5, 6, 11


def decode_error(frame):
    """(version, message, code) when the frame is an Envelope carrying an Error, else None."""
    f = parse_fields(frame)
    if ERROR not in f:
        return None
    e = parse_fields(f[ERROR][0])
    return (f.get(1, [0])[0], e.get(1, [b""])[0].decode("utf-8", "replace"), e.get(2, [0])[0])


# ===== ZMTP 3.0, NULL mechanism, DEALER side =====

class Dealer:
    def __init__(self, path, timeout=5.0):
        self.s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.s.settimeout(timeout)
        self.s.connect(path)
        greeting = (b"\xff" + b"\x00" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\x00") +
                    b"\x00" + b"\x00" * 31)
        assert len(greeting) == 64
        self.s.sendall(greeting)
        peer = self.recv_exact(64)
        if peer[0] != 0xFF or peer[9] != 0x7F or peer[10] < 3:
            raise AssertionError("not a ZMTP 3 greeting: %r" % peer)
        if peer[12:16] != b"NULL":
            raise AssertionError("the coordinator wants mechanism %r" % peer[12:32])
        self.send_command(b"READY", {b"Socket-Type": b"DEALER", b"Identity": b""})
        flags, body = self.recv_frame()
        if not flags & 0x04 or not body.startswith(b"\x05READY"):
            raise AssertionError("expected READY, got flags %d %r" % (flags, body[:40]))
        if b"ROUTER" not in body:
            raise AssertionError("the peer is not a ROUTER: %r" % body)

    def recv_exact(self, n):
        out = b""
        while len(out) < n:
            chunk = self.s.recv(n - len(out))
            if not chunk:
                raise ConnectionError("the coordinator closed the connection")
            out += chunk
        return out

    def send_command(self, name, props):
        body = bytes([len(name)]) + name
        for k, v in props.items():
            body += bytes([len(k)]) + k + struct.pack(">I", len(v)) + v
        self.s.sendall(bytes([0x04, len(body)]) + body)

    def send(self, *frames):
        """One message of one or more frames."""
        out = b""
        for i, f in enumerate(frames):
            more = 0x01 if i < len(frames) - 1 else 0
            if len(f) < 256:
                out += bytes([more, len(f)]) + f
            else:
                out += bytes([more | 0x02]) + struct.pack(">Q", len(f)) + f
        self.s.sendall(out)

    def recv_frame(self):
        flags = self.recv_exact(1)[0]
        size = struct.unpack(">Q", self.recv_exact(8))[0] if flags & 0x02 else self.recv_exact(1)[0]
        return flags, self.recv_exact(size)

    def recv(self, timeout=5.0):
        """The next message (list of frames), skipping commands; None on timeout."""
        self.s.settimeout(timeout)
        frames = []
        try:
            while True:
                flags, body = self.recv_frame()
                if flags & 0x04:
                    continue  # PING and other commands
                frames.append(body)
                if not flags & 0x01:
                    return frames
        except socket.timeout:
            return None

    def close(self):
        self.s.close()


def expect_error(d, contains, what):
    m = d.recv(5.0)
    G.check(m is not None, "%s: no answer from the coordinator in 5s", what)
    err = decode_error(m[-1])
    G.check(err is not None, "%s: the answer is not an Error envelope: %r", what, m)
    version, msg, code = err
    G.check(version == PROTOCOL_VERSION, "%s: the Error carries version %d", what, version)
    G.check(contains in msg, "%s: the Error says %r, expected it to mention %r", what, msg, contains)
    G.log("  %s -> Error %d: %s" % (what, code, msg))
    return msg


def expect_silence(d, what, wait=0.5):
    m = d.recv(wait)
    G.check(m is None, "%s: unexpected answer %r", what, m)


# ===== the test =====

@t.case
def test_control_bad_frames_and_protocol_version():
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "control socket test"
    want = G.run_ids(model, prompt, 32)
    with G.Group("control", model, workers=2, speculators=["ngram"]) as g:
        G.check_eq(g.ids(prompt, 32), want, "completion before")
        cpid = g.coordinator_pid()
        ctl = g.path("ctl")
        G.check(os.path.exists(ctl), "no control socket at %s", ctl)
        d = Dealer(ctl)

        def logged(text, what):
            g.wait_log("coordinator", text, timeout=5)
            G.log("  %s: logged %r" % (what, text))

        # garbage: 0xff is field 31 with the invalid wire type 7
        garbage = b"\xff\xff\xff\xff garbage \x00\x01"
        d.send(garbage)
        logged("ignoring a bad frame: malformed frame of %d bytes" % len(garbage), "garbage")
        expect_silence(d, "garbage")
        # a truncated varint
        d.send(b"\x08\x80")
        logged("malformed frame of 2 bytes", "truncated varint")
        # wrong protocol version, body a Heartbeat
        d.send(envelope(999, HEARTBEAT, b""))
        logged("protocol version 999", "version 999")
        msg = expect_error(d, "protocol version 999", "version 999")
        G.check("speaks %d" % PROTOCOL_VERSION in msg, "the Error does not name our version: %r", msg)
        # an empty frame unpacks as version 0
        d.send(b"")
        logged("protocol version 0", "empty frame")
        expect_error(d, "protocol version 0", "empty frame")
        # the right version without a body
        d.send(envelope(PROTOCOL_VERSION))
        logged("envelope without a message body", "no body")
        expect_silence(d, "no body")
        # larger than the 1 MiB frame limit
        d.send(b"\x00" * ((1 << 20) + 16))
        logged("exceeds the", "oversized frame")
        # two frames in one message: the first is judged, the rest dropped
        d.send(b"\xff\xfe\xfd", envelope(PROTOCOL_VERSION, HEARTBEAT, b""))
        logged("malformed frame of 3 bytes", "multipart")
        # a StepDone from a peer that never said Hello: ignored
        d.send(envelope(PROTOCOL_VERSION, STEP_DONE, field_varint(1, 1)))
        expect_silence(d, "StepDone from a stranger")
        # Hellos the coordinator must refuse, each with an Error
        d.send(envelope(PROTOCOL_VERSION, HELLO, b""))
        expect_error(d, "without a role", "Hello without a role")
        d.send(envelope(PROTOCOL_VERSION, HELLO, field_varint(1, 1) + field_varint(9, 99)))
        expect_error(d, "worker index 99", "Hello as worker 99")
        d.send(envelope(PROTOCOL_VERSION, HELLO, field_varint(1, 2) + field_bytes(2, "impostor") +
                        field_bytes(6, "model") + field_varint(7, 5) + field_varint(8, 12345)))
        expect_error(d, "differs", "Hello with another vocabulary")
        d.close()

        # raw bytes that are not ZMTP at all, then a connection dropped mid-greeting
        for junk in (b"GET / HTTP/1.0\r\n\r\n" * 8, b"\xff\x00\x00"):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.connect(ctl)
            s.sendall(junk)
            time.sleep(0.2)
            s.close()

        time.sleep(0.5)
        G.check(G.pid_alive(cpid), "the coordinator (pid %d) died", cpid)
        clog = g.log("coordinator")
        G.check("impostor" not in g.status(), "a refused speculator shows in status")
        st = g.wait_status(lambda s: all(s.get(r, {}).get("connected") for r in ("worker-0", "worker-1", "ngram")),
                           10, "workers and speculator still connected")
        G.check(all(st[r]["restarts"] == 0 for r in ("worker-0", "worker-1", "ngram")),
                "a role was restarted: %r", {k: v["line"] for k, v in st.items()})
        G.check(clog.count("ignoring a bad frame") >= 7, "expected at least 7 bad frames logged:\n%s",
                clog[-3000:])
        r = g.complete(prompt, 32)
        G.check_eq(r["orochi"]["token_ids"], want, "completion after the bad frames")


@t.case
def test_control_wrong_version_peer_gets_error_and_group_serves():
    # a peer one version ahead (and one behind) sends Hellos as worker-0: refused every time with
    # an Error naming its version, and nothing changes for the real worker-0
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "another control test"
    want = G.run_ids(model, prompt, 24)
    with G.Group("control2", model, workers=1) as g:
        d = Dealer(g.path("ctl"))
        for v in (PROTOCOL_VERSION + 1, PROTOCOL_VERSION - 1, PROTOCOL_VERSION + 1):
            d.send(envelope(v, HELLO, field_varint(1, 1) + field_varint(9, 0)))
            expect_error(d, "protocol version %d" % v, "Hello of version %d" % v)
        d.close()
        st = g.status()
        G.check(st["worker-0"]["connected"] and st["worker-0"]["restarts"] == 0,
                "the real worker-0 was disturbed: %s", st["worker-0"]["line"])
        G.check_eq(g.ids(prompt, 24), want, "completion after the other-version peer")


@t.case
def test_control_impostor_worker_hello():
    # a stranger says Hello as worker-1 while the real worker-1 is connected. Whether the
    # coordinator refuses it or hands it the slot, the group must end up serving correct output
    # with both real workers connected, within a few heartbeat timeouts.
    model = G.mkmodel(layers=2, dim=128, ffn=256, heads=4, kv_heads=4, vocab=300, ctx=256, type="f32", seed=5)
    prompt = "impostor"
    want = G.run_ids(model, prompt, 24)
    with G.Group("impostor", model, workers=2, extra=["--dead-ms", "1000"]) as g:
        d = Dealer(g.path("ctl"))
        d.send(envelope(PROTOCOL_VERSION, HELLO, field_varint(1, 1) + field_varint(3, 4242) + field_varint(9, 1)))
        m = d.recv(3.0)
        G.check(m is not None, "no answer to the impostor's Hello")
        kind = "Error" if ERROR in parse_fields(m[-1]) else "Welcome" if 3 in parse_fields(m[-1]) else "?"
        G.log("  the impostor got: %s" % kind)
        t0 = time.time()
        r = g.http("/v1/completions", "POST", {"prompt": prompt, "max_tokens": 24, "temperature": 0}, timeout=60)
        G.check(r.status == 200, "completion with an impostor around: %r", r)
        G.check_eq(r.json["orochi"]["token_ids"], want, "completion with an impostor around")
        G.log("  completion took %.1fs" % (time.time() - t0))
        d.close()
        g.wait_status(lambda s: s["worker-0"]["connected"] and s["worker-1"]["connected"] and
                      s["worker-1"]["pid"] != 4242, 20, "both real workers connected")
        G.check_eq(g.ids(prompt, 24), want, "completion after the impostor left")


if __name__ == "__main__":
    t.main()
