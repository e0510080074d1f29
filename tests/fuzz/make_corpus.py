#!/usr/bin/env python3
"""Write the seed corpora of the fuzz targets (docs/fuzzing.md).

  OUT_DIR/*.gguf             fuzz_gguf: tiny valid GGUF files (v3, v2, K-quants)
  OUT_DIR/http_body/         fuzz_http_body: request bodies of both routes, valid and refused
  OUT_DIR/tokenizer/         fuzz_tokenizer: texts for each vocabulary and mode
  OUT_DIR/chat_template/     fuzz_chat_template: real templates (SmolLM2's ChatML, Llama-2) with
                             conversations and stop strings
  OUT_DIR/proto/             fuzz_proto: Envelope frames as peers send them (Hello, DraftReady...)
  OUT_DIR/arena/             fuzz_arena: arena headers laid out as the coordinator does, and broken

Each seed is in its target's input format, described at the top of tests/fuzz/fuzz_<target>.c.
Pure Python, no dependencies. Usage: make_corpus.py [OUT_DIR] (default: the corpus/ folder next
to this script). The files are deterministic, so re-running it changes nothing in git.
"""
import os
import struct
import sys

# GGUF value type ids
U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
SCALAR_FMT = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f",
              BOOL: "<B", U64: "<Q", I64: "<q", F64: "<d"}
# ggml tensor types used here: id -> (elements per block, bytes per block)
GGML = {0: (1, 4), 1: (1, 2), 2: (32, 18), 6: (32, 22), 8: (32, 34), 11: (256, 110),
        12: (256, 144), 14: (256, 210), 20: (32, 18)}


def gstr(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def value(vtype, v):
    """Encode a value; arrays are given as (elem_type, [elements])."""
    if vtype == STR:
        return gstr(v)
    if vtype == ARR:
        elem, items = v
        out = struct.pack("<IQ", elem, len(items))
        return out + b"".join(value(elem, x) for x in items)
    return struct.pack(SCALAR_FMT[vtype], v)


def gguf(version, kvs, tensors, alignment=32):
    """kvs: [(key, type, value)]; tensors: [(name, ggml_type, shape)]; data bytes are a pattern."""
    out = bytearray(b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kvs)))
    for key, vtype, v in kvs:
        out += gstr(key) + struct.pack("<I", vtype) + value(vtype, v)
    offset = 0
    blobs = []
    for name, ttype, shape in tensors:
        block, nbytes = GGML[ttype]
        assert shape[0] % block == 0
        size = shape[0] // block * nbytes
        for d in shape[1:]:
            size *= d
        out += gstr(name) + struct.pack("<I", len(shape))
        out += b"".join(struct.pack("<Q", d) for d in shape)
        out += struct.pack("<IQ", ttype, offset)
        blobs.append((offset, bytes((i * 7 + 3) & 0xFF for i in range(size))))
        offset = (offset + size + alignment - 1) // alignment * alignment
    out += b"\0" * (-len(out) % alignment)
    data_start = len(out)
    for off, blob in blobs:
        out += b"\0" * (data_start + off - len(out))
        out += blob
    return bytes(out)


def seeds():
    v3 = gguf(3, [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 32),
        ("llama.block_count", U32, 1),
        ("t.u8", U8, 7), ("t.i8", I8, -7), ("t.u16", U16, 700), ("t.i16", I16, -700),
        ("t.i32", I32, -70000), ("t.f32", F32, 0.5), ("t.bool", BOOL, 1),
        ("t.u64", U64, 1 << 40), ("t.i64", I64, -(1 << 40)), ("t.f64", F64, 2.25),
        ("tokenizer.ggml.tokens", ARR, (STR, ["<s>", "</s>", "a", "b", "ab"])),
        ("tokenizer.ggml.scores", ARR, (F32, [0.0, 0.0, -1.0, -2.0, -3.0])),
        ("tokenizer.ggml.token_type", ARR, (I32, [3, 3, 1, 1, 1])),
        ("t.nested", ARR, (ARR, [(U16, [1, 2]), (STR, ["x"]), (ARR, [(U8, [])])])),
    ], [
        ("token_embd.weight", 8, (32, 5)),
        ("output_norm.weight", 0, (32,)),
    ])
    v2 = gguf(2, [
        ("general.architecture", STR, "llama"),
        ("general.alignment", U32, 64),
        ("tokenizer.ggml.merges", ARR, (STR, ["a b", "ab c"])),
        ("t.empty", ARR, (U32, [])),
    ], [
        ("blk.0.attn_q.weight", 2, (32, 2)),
        ("blk.0.attn_k.weight", 1, (4, 2, 1)),
    ], alignment=64)
    kq = gguf(3, [
        ("general.architecture", STR, "llama"),
    ], [
        ("blk.0.ffn_down.weight", 12, (256, 2)),
        ("blk.0.attn_v.weight", 14, (256, 1)),
        ("blk.0.ffn_up.weight", 11, (256, 1)),
        ("blk.0.attn_q.weight", 6, (64, 2)),
        ("blk.0.attn_k.weight", 20, (32, 3)),
    ])
    return {"tiny_v3.gguf": v3, "tiny_v2.gguf": v2, "kquants.gguf": kq}


# ---- fuzz_http_body: flags byte (bit 0 chat, bits 1-2 max_tokens cap, bits 3-7 split seed) + body

def http_seeds():
    C, CHAT = 0x00, 0x01
    bodies = {
        "completion_min": (C, b'{"prompt":"Hello","max_tokens":16}'),
        "completion_full": (C | 0x28, (
            b'{"model":"fuzz-model","prompt":["Once upon a time"],"max_tokens":32,'
            b'"temperature":0.7,"top_p":0.9,"top_k":40,"seed":42,"stream":true,'
            rb'"stream_options":{"include_usage":true},"stop":["\n\n","END"],"echo":true,"n":1,'
            b'"logprobs":null,"best_of":1,"suffix":"","orochi":{"draft":["ngram"],"width":8}}')),
        "completion_unicode": (C | 0x50, rb'{"prompt":"caf\u00e9 \ud83d\ude42 \"q\" \t ' +
                                      "日本\"}".encode()),
        "chat_min": (CHAT, b'{"messages":[{"role":"user","content":"Hi"}]}'),
        "chat_full": (CHAT | 0x30, (
            b'{"model":"fuzz-model","messages":[{"role":"system","content":"Be brief."},'
            b'{"role":"developer","content":"No lists."},{"role":"user","content":[{"type":"text",'
            b'"text":"Hello, "},{"type":"text","text":"world"}]},{"role":"assistant",'
            rb'"content":"Hi!"},{"role":"user","content":"\u00bfQu\u00e9 tal?"}],'
            rb'"max_tokens":64,"temperature":0,"stop":"\n","stream":false,"top_logprobs":0}')),
        "chat_cap1": (CHAT | 0x02, b'{"messages":[{"role":"user","content":"x"}],"max_tokens":1}'),
        "chat_bigcap": (CHAT | 0x04, b'{"messages":[{"role":"user","content":"x"}],'
                                     b'"max_tokens":99999,'
                                     b'"seed":-9007199254740993,"top_k":16777216}'),
        # refused, each for one reason
        "bad_nul": (C, rb'{"prompt":"a\u0000b"}'),
        "bad_utf8": (C, b'{"prompt":"\xff\xfe"}'),
        "bad_trailing": (C, b'{"prompt":"x"} x'),
        "bad_type": (CHAT, b'{"messages":[{"role":"tool","content":5}],"max_tokens":"5"}'),
        "bad_range": (C, b'{"prompt":"x","temperature":3,"top_p":0,"max_tokens":1e400}'),
        "bad_model": (C, b'{"prompt":"x","model":"gpt-4o"}'),
        "bad_stop": (C, b'{"prompt":"x","stop":["a","b","c","d","e"]}'),
        "bad_nested": (CHAT, b'{"messages":[[[[[[[[[[[[[[[[{}]]]]]]]]]]]]]]]]}'),
        "bad_stream_options": (C, b'{"prompt":"x","stream_options":{"include_usage":1}}'),
        "bad_logprobs": (CHAT, b'{"messages":[{"role":"user","content":"x"}],"logprobs":true}'),
        "not_object": (C, b'["prompt"]'),
        "empty": (CHAT, b''),
    }
    return {name: bytes([flags]) + body for name, (flags, body) in bodies.items()}


# ---- fuzz_tokenizer: mode byte (bits 0-2 vocabulary, bit 3 parse_special, ...) + text

def tokenizer_seeds():
    seeds = {
        "bpe_english": (0x00, "Hello world, it's 2024! The caf\u00e9 costs 12.50\u20ac. Done.\n\n"),
        "bpe_chatml_special": (0x08,
                               "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool>"),
        "bpe_chatml_plain": (0x00, "<|im_start|>user\nHi<|im_end|>\n"),
        "smollm_digits": (0x01, "digits 1234567 and \t\ttabs\r\n  spaces   end"),
        "llama3_mixed": (0x02, "I'M HERE, we'll've 'S \u65e5\u672c\u8a9e \U0001F642 \u2019s"),
        "spm_english": (0x03, " the and the  caf\u00e9 12 \u65e5\u672c"),
        "spm_special": (0x0B, "<s>he said</s> the end"),
        "spm_noprefix": (0x04, "no prefix: the and"),
        "real_bpe": (0x06, "Real vocabulary text, with ChatML <|im_start|>user\n"),
        "real_spm": (0x0F, "<s> [INST] hello [/INST]"),
    }
    out = {name: bytes([mode]) + text.encode("utf-8") for name, (mode, text) in seeds.items()}
    out["bpe_invalid_utf8"] = bytes([0x00]) + b"ok \xff\xfe\xc3 \xe2\x80 \xf0\x9f\x99 \x00 end"
    out["spm_invalid_utf8"] = bytes([0x03]) + b"\xe2\x96 x \xc0\xaf \xed\xa0\x80"
    # vocabularies from the input: lines up to NUL, then the text
    out["input_vocab_gpt2"] = bytes([0x35]) + b"a b\nab\n<x>\nab c\nabc\x00abc <x> ab a"
    out["input_vocab_llama"] = bytes([0x05]) + "\u2581the\nhe\n<0x41>\n<s>\nt\x00 the A<s>".encode()
    out["input_vocab_bytes"] = bytes([0x25]) + "\u2581a\nb\x00 a b \u00e9".encode()
    return out


# ---- fuzz_chat_template: flags, u16 template length, template, NUL-separated records
#      (record byte % 5: 0 system, 1 user, 2 assistant, 3 developer, 4 stop string)

SMOLLM2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + "
    "'<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|im_start|>assistant\n' }}{% endif %}")
CHATML_EXPR_TEMPLATE = (
    "{{ '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}"
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
    "{% endfor %}")
LLAMA2_TEMPLATE = (
    "{% if messages[0]['role'] == 'system' %}{% set system_message = '<<SYS>>\n' + "
    "messages[0]['content'] | trim + '\n<</SYS>>\n\n' %}{% endif %}{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + content | trim + ' [/INST]' }}"
    "{% elif message['role'] == 'assistant' %}{{ ' ' + content | trim + ' ' + eos_token }}"
    "{% endif %}{% endfor %}")


def chat_seed(flags, template, records):
    t = template.encode("utf-8")
    body = b"\0".join(bytes([kind]) + text.encode("utf-8") for kind, text in records)
    return bytes([flags]) + struct.pack("<H", len(t)) + t + body


def chat_seeds():
    SYS, USER, ASSIST, DEV, STOP = 0, 1, 2, 3, 4
    return {
        "smollm_one_turn": chat_seed(0x00, SMOLLM2_TEMPLATE, [(USER, "Hello!")]),
        "smollm_multi_turn": chat_seed(0x21, SMOLLM2_TEMPLATE, [
            (USER, "Hi"), (ASSIST, "Hello! How can I help?"), (USER, "Tell me a joke."),
            (STOP, "\n\n"), (STOP, "joke")]),
        "smollm_own_system": chat_seed(0x40, SMOLLM2_TEMPLATE, [
            (DEV, "Be brief."), (USER, "Hi <|im_end|> there"), (STOP, "<|im_start|>")]),
        "chatml_expression_system": chat_seed(0x03, CHATML_EXPR_TEMPLATE, [
            (SYS, "You are terse."), (USER, "\u65e5\u672c\u8a9e \U0001F642")]),
        "llama2": chat_seed(0x10, LLAMA2_TEMPLATE, [
            (SYS, "Answer in French."), (USER, "Hello"), (ASSIST, "Bonjour"), (USER, "Thanks"),
            (STOP, "[INST]")]),
        "llama2_trailing_system": chat_seed(0x04, LLAMA2_TEMPLATE, [(USER, "Hi"), (SYS, "late")]),
        "no_template": chat_seed(0x08, "", [(USER, "plain"), (ASSIST, "reply")]),
        "no_messages": chat_seed(0x00, SMOLLM2_TEMPLATE, []),
    }


# ---- fuzz_proto: records of flags, id length, id, u16 payload length, payload (an Envelope)

def pb_varint(v):
    v &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = v & 0x7F
        v >>= 7
        out.append(b | (0x80 if v else 0))
        if not v:
            return bytes(out)


def pb_msg(fields):
    """fields: [(number, value)]; int -> varint, str/bytes -> length-delimited,
    list -> packed varints (packed fixed32 floats when its items are floats)."""
    out = bytearray()
    for num, v in fields:
        if isinstance(v, bool) or isinstance(v, int):
            out += pb_varint(num << 3) + pb_varint(int(v))
        elif isinstance(v, list):
            if v and isinstance(v[0], float):
                packed = struct.pack("<%df" % len(v), *v)
            else:
                packed = b"".join(pb_varint(x) for x in v)
            out += pb_varint(num << 3 | 2) + pb_varint(len(packed)) + packed
        else:
            b = v.encode("utf-8") if isinstance(v, str) else v
            out += pb_varint(num << 3 | 2) + pb_varint(len(b)) + b
    return bytes(out)


def envelope(body_field, body, version=2):
    return pb_msg([(1, version), (body_field, pb_msg(body))])


def proto_record(payload, ident=b"peer-1", flags=0):
    return bytes([flags, len(ident)]) + ident + struct.pack("<H", len(payload)) + payload


def proto_seeds():
    HELLO, WELCOME, STEP_BEGIN, STEP_DONE, HEARTBEAT = 2, 3, 4, 5, 6
    DRAFT_REQUEST, DRAFT_READY, FEEDBACK, SHUTDOWN, ERROR, RECONFIGURE = 7, 8, 9, 10, 11, 12
    worker = envelope(HELLO, [(1, 1), (2, "worker-0"), (3, 4242), (4, "cpu"), (5, 4), (9, 0)])
    worker1 = envelope(HELLO, [(1, 1), (2, "worker-1"), (3, 4243), (4, "cpu"), (5, 4), (9, 1)])
    spec = envelope(HELLO, [(1, 2), (2, "spec-ngram-0"), (3, 99), (4, "cpu"), (6, "ngram")])
    spec_model = envelope(HELLO, [(1, 2), (2, "spec-model-1"), (6, "model"), (7, 300),
                                  (8, 0x1234abcd)])
    spec_wrong_vocab = envelope(HELLO, [(1, 2), (2, "spec-model-2"), (6, "model"), (7, 49152),
                                        (8, 7)])
    ready = envelope(DRAFT_READY, [(1, 7), (2, 12), (3, 3), (4, 5)])
    ready_far = envelope(DRAFT_READY, [(1, 8), (2, 1), (3, 4000000000), (4, 64)])
    hb = envelope(HEARTBEAT, [(1, 123456), (2, 7), (3, "ready")])
    done = envelope(STEP_DONE, [(1, 5), (2, 0), (3, 1500), (4, 20), (5, "")])
    err = envelope(ERROR, [(1, "out of memory"), (2, 500)])
    welcome = envelope(WELCOME, [(1, "/orochi-0123456789abcdef"), (2, 3), (3, 1), (4, 0), (5, 2),
                                 (6, 16), (7, 2048), (8, 0), (9, "/models/m.gguf"), (10, 2)])
    feedback = envelope(FEEDBACK, [(1, 7), (2, 5), (3, [1, 2, 3, 4, 5]), (4, True), (5, 0), (6, 0),
                                   (7, False), (8, 16), (9, 4), (10, True)])
    feedback_neg = envelope(FEEDBACK, [(1, 7), (2, 6), (3, [-1, 2 ** 31 - 1]), (9, 2 ** 32 - 1)])
    return {
        "worker_join": proto_record(worker, b"w0") + proto_record(hb, b"w0") +
                       proto_record(done, b"w0") + proto_record(err, b"w0"),
        "workers_two": proto_record(worker, b"w0") + proto_record(worker1, b"w1") +
                       proto_record(worker, b"imposter"),
        "speculator_drafts": proto_record(spec, b"s0") + proto_record(ready, b"s0") +
                             proto_record(ready_far, b"s0") + proto_record(hb, b"s0"),
        "speculator_vocab": proto_record(spec_model, b"s1") + proto_record(spec_wrong_vocab, b"s2"),
        "unknown_peer": proto_record(ready, b"nobody") + proto_record(hb, b"nobody"),
        "peer_side": proto_record(welcome, flags=1) + proto_record(feedback, flags=1) +
                     proto_record(feedback_neg, flags=1) +
                     proto_record(envelope(STEP_BEGIN, [(1, 9), (2, 3), (3, 10), (4, 0), (5, 1)]),
                                  flags=1) +
                     proto_record(envelope(DRAFT_REQUEST, [(1, 7), (2, 8), (3, 12)]), flags=1) +
                     proto_record(envelope(SHUTDOWN, [(1, "bye")]), flags=1) +
                     proto_record(envelope(RECONFIGURE, [(1, 2), (2, 2), (3, [0.7, 0.3] * 7),
                                                         (4, 1)]), flags=1),
        "bad_frames": proto_record(envelope(HEARTBEAT, [(1, 1)], version=1), b"w0") +
                      proto_record(pb_msg([(1, 2)]), b"w0") +
                      proto_record(b"\xff\xff\xff", b"w0", flags=2) +
                      proto_record(worker, b"w0", flags=2),
    }


# ---- fuzz_arena: flags (bit 0 magic, 1 version, 2 total_size, 3-4 padding, 5 scribble,
#      6 unlink_stale, 7 our pid) + the object's bytes from the header on

ARENA_MAGIC, ARENA_LAYOUT_VERSION, ARENA_MAX_REGIONS = 0x4F524F4348494131, 5, 32
ARENA_HEADER = 40 + ARENA_MAX_REGIONS * 48  # sizeof(arena_header)
ARENA_FIRST = (ARENA_HEADER + 63) // 64 * 64
DRAFT_BYTES = 32 + 3 * 64 * 4  # sizeof(arena_draft)
RING_BYTES = 8 + 8 * DRAFT_BYTES  # arena_draft_ring_bytes(8)


def arena_header(regions, total=0, magic=ARENA_MAGIC, version=ARENA_LAYOUT_VERSION, pid=1,
                 n_regions=None):
    out = struct.pack("<QIIQQQ", magic, version, len(regions) if n_regions is None else n_regions,
                      total, 1, pid)
    for name, off, size in regions:
        out += name.ljust(32, b"\0")[:32] + struct.pack("<QQ", off, size)
    return out + b"\0" * (ARENA_HEADER - len(out))


def layout(specs, start=ARENA_FIRST):
    regions, off = [], start
    for name, size in specs:
        regions.append((name, off, size))
        off = (off + size + 63) // 64 * 64
    return regions, off


def arena_seeds():
    FIX = 1 | 2 | 4  # right magic, version and total_size
    pad = {0: 0, 1: 64, 2: 4096, 3: 65536}
    seeds = {}
    # the coordinator's layout, scaled to fit: step, llama, logits, drafts, hidden
    regions, end = layout([(b"step", 1024), (b"llama", 16384), (b"logits", 8192),
                           (b"drafts", RING_BYTES), (b"hidden", 2048)])
    hdr = arena_header(regions)
    seeds["coordinator_layout"] = bytes([FIX | 3 << 3]) + hdr
    seeds["coordinator_layout_scribbled"] = bytes([FIX | 3 << 3 | 32]) + hdr
    assert end <= len(hdr) + pad[3]
    # a drafts region inside the input's own bytes: ring 0 with n_slots = 8 and one draft
    regions, _ = layout([(b"drafts", RING_BYTES)])
    ring = struct.pack("<II", 8, 1) + struct.pack("<IIQQi", 2, 3, 7, 12, 5)
    ring += struct.pack("<3i", 11, 12, 13)
    hdr = arena_header(regions)
    slots = struct.pack("<6I", 0, 1, 7, 8, 255, 4000000000)  # read as slot numbers after the header
    body = hdr + slots[:ARENA_FIRST - ARENA_HEADER] + ring
    seeds["drafts_ring"] = bytes([FIX | 3 << 3]) + body
    # no regions at all; then the stale probe on our own (live) arena and on a dead one
    seeds["empty"] = bytes([FIX | 1 << 3]) + arena_header([])
    seeds["probe_ours"] = bytes([FIX | 1 << 3 | 64 | 128]) + arena_header([])
    seeds["probe_dead"] = bytes([FIX | 1 << 3 | 64]) + arena_header([], pid=2 ** 31 - 2)
    seeds["probe_garbage"] = bytes([64 | 1 << 3]) + b"not an arena" * 140
    # refused, each for one reason
    seeds["overlap"] = bytes([FIX | 2 << 3]) + arena_header(
        [(b"a", ARENA_FIRST, 256), (b"b", ARENA_FIRST + 128, 64)])
    seeds["duplicate"] = bytes([FIX | 2 << 3]) + arena_header(
        [(b"a", ARENA_FIRST, 64), (b"a", ARENA_FIRST + 64, 64)])
    seeds["unaligned"] = bytes([FIX | 2 << 3]) + arena_header([(b"a", ARENA_FIRST + 1, 64)])
    seeds["outside"] = bytes([FIX | 1 << 3]) + arena_header([(b"a", ARENA_FIRST, 1 << 40)])
    seeds["in_header"] = bytes([FIX | 2 << 3]) + arena_header([(b"a", 64, 64)])
    seeds["unterminated_name"] = bytes([FIX | 2 << 3]) + arena_header(
        [(b"x" * 32, ARENA_FIRST, 64)])
    seeds["too_many"] = bytes([FIX | 2 << 3]) + arena_header([], n_regions=33)
    seeds["wrong_size"] = bytes([3 | 2 << 3]) + arena_header([], total=12345)
    seeds["wrong_version"] = bytes([5 | 1 << 3]) + arena_header([], version=2)
    seeds["truncated"] = bytes([FIX]) + arena_header([])[:100]
    return seeds


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "corpus")
    os.makedirs(out_dir, exist_ok=True)
    for name, blob in seeds().items():
        assert len(blob) < 4096, name
        with open(os.path.join(out_dir, name), "wb") as f:
            f.write(blob)
        print(f"{os.path.join(out_dir, name)}: {len(blob)} bytes")
    for target, make in (("http_body", http_seeds), ("tokenizer", tokenizer_seeds),
                         ("chat_template", chat_seeds), ("proto", proto_seeds),
                         ("arena", arena_seeds)):
        d = os.path.join(out_dir, target)
        os.makedirs(d, exist_ok=True)
        for name, blob in make().items():
            assert len(blob) <= 4096, (target, name, len(blob))
            with open(os.path.join(d, name), "wb") as f:
                f.write(blob)
        print(f"{d}/: {len(make())} seeds")


if __name__ == "__main__":
    main()
