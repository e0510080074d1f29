"""ctest `reference_schema_jsonschema`: the grammars of coordinator/schema.c against an independent
validator, python3-jsonschema.

For a set of schemas (closed objects with optional keys, bounded integers and numbers, strings
with lengths and formats, enums and consts, anyOf, recursive $refs, open objects), random
documents are made — mostly following the schema, sometimes breaking it (a missing or extra key,
a value out of range, a string or array too long, a wrong type) — and written by json.dumps in
its three layouts (spaced, compact, indented; escaped or raw non-ASCII). `unit_schema --match`
says whether each document is a sentence of the schema's grammar; jsonschema (with its format
checker) says whether it is valid. They must agree, except where the grammar knowingly accepts
fewer spellings (docs/http-api.md): a whole number written 3.0 for an integer, and -0.0. A
negative control runs one schema's grammar over another's documents: it must disagree.

Environment: OROCHI_BIN (unit_schema is looked for beside it), OROCHI_SOURCE. Exit 0 pass,
1 fail, 77 skip (jsonschema or unit_schema missing).
"""
import json
import os
import random
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("OROCHI_SOURCE", os.path.dirname(os.path.dirname(HERE)))
OROCHI_BIN = os.environ.get("OROCHI_BIN", os.path.join(SOURCE, "build", "bin", "orochi"))
UNIT = os.path.join(os.path.dirname(OROCHI_BIN), "unit_schema")

try:
    from jsonschema import Draft202012Validator, FormatChecker
except ImportError:
    print("reference_schema_jsonschema: SKIPPED: python3-jsonschema is not installed")
    sys.exit(77)
if not os.path.isfile(UNIT):
    print("reference_schema_jsonschema: SKIPPED: %s is not built" % UNIT)
    sys.exit(77)

SCHEMAS = [
    {"type": "object", "additionalProperties": False, "required": ["name", "age"], "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "score": {"type": "number", "minimum": -5, "exclusiveMaximum": 5},
        "tags": {"type": "array", "items": {"type": "string", "minLength": 1, "maxLength": 3}, "maxItems": 3},
        "kind": {"enum": ["a", "b", 1, None]},
        "ok": {"type": ["boolean", "null"]}}},
    {"$defs": {"node": {"type": "object", "additionalProperties": False, "required": ["v"], "properties": {
        "v": {"type": "integer", "exclusiveMinimum": -3, "maximum": 20},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}}}},
     "$ref": "#/$defs/node"},
    {"anyOf": [{"type": "string", "minLength": 2, "maxLength": 4},
               {"type": "integer", "minimum": -100, "maximum": -10}, {"type": "null"}]},
    {"type": "array", "items": {"type": "number", "minimum": -2, "maximum": 3}, "minItems": 1, "maxItems": 4},
    {"type": "object", "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 999}},
    {"type": "object", "additionalProperties": False, "properties": {
        "d": {"type": "string", "format": "date"}, "u": {"type": "string", "format": "uuid"},
        "ip": {"type": "string", "format": "ipv4"}, "dt": {"type": "string", "format": "date-time"}}},
    {"type": "object", "additionalProperties": False, "required": ["b"], "properties": {
        "a": {"const": {"x": [1, "y", None]}},
        "b": {"type": "integer", "minimum": 123, "maximum": 45678},
        "c": {"type": "integer", "minimum": -98765, "maximum": -4321}}},
]

FORMAT_SAMPLES = {
    "date": ["2024-02-29", "2023-02-29", "2023-04-31", "1999-12-31", "2000-02-29", "1900-02-29",
             "2023-1-01", "2023-06-30"],
    "uuid": ["123e4567-e89b-12d3-a456-426614174000", "123e4567e89b12d3a456426614174000",
             "123E4567-E89B-12D3-A456-42661417400Z"],
    "ipv4": ["1.2.3.4", "256.0.0.1", "01.2.3.4", "255.255.255.255", "1.2.3"],
    "date-time": ["2024-01-15T10:20:30Z", "2024-01-15T10:20:30.25+01:00", "2024-01-15 10:20:30Z",
                  "2024-02-30T00:00:00Z"],
}


class Maker:
    """Random documents near a schema."""

    def __init__(self, seed, root):
        self.rng = random.Random(seed)
        self.root = root

    def text(self, lo=0, hi=6):
        pool = "abcxyz\u00e9\u20ac\"\\\n\t/\U0001F600 "
        return "".join(self.rng.choice(pool) for _ in range(self.rng.randint(lo, hi)))

    def number(self):
        r = self.rng.random()
        if r < 0.4:
            return self.rng.randint(-200, 200)
        if r < 0.6:
            return self.rng.randint(-100000, 100000)
        if r < 0.9:
            return round(self.rng.uniform(-10, 10), self.rng.randint(1, 4))
        return self.rng.choice([0, 0.5, 1000, 130, 131, 5, -5, 4.999, 20, 21, -3, -2, 999, 1])

    def anything(self, depth=0):
        r = self.rng.random()
        if depth > 2 or r < 0.5:
            return self.rng.choice([None, True, False, self.number(), self.text(), self.number()])
        if r < 0.75:
            return [self.anything(depth + 1) for _ in range(self.rng.randint(0, 3))]
        return {self.text(1, 3): self.anything(depth + 1) for _ in range(self.rng.randint(0, 3))}

    def doc(self, s, depth=0):
        rng = self.rng
        while isinstance(s, dict) and "$ref" in s:
            s = self.root["$defs"][s["$ref"].split("/")[-1]]
        if rng.random() < 0.08 or depth > 4:
            return self.anything(depth)
        if "anyOf" in s:
            return self.doc(rng.choice(s["anyOf"]), depth)
        if "const" in s:
            return s["const"] if rng.random() < 0.8 else self.anything()
        if "enum" in s:
            return rng.choice(s["enum"]) if rng.random() < 0.8 else self.anything()
        t = s.get("type")
        if isinstance(t, list):
            t = rng.choice(t)
        if t == "null":
            return None
        if t == "boolean":
            return rng.random() < 0.5
        if t in ("integer", "number"):
            lo = s.get("minimum", s.get("exclusiveMinimum", -50))
            hi = s.get("maximum", s.get("exclusiveMaximum", 50))
            if rng.random() < 0.3:
                return self.number()
            if rng.random() < 0.1:
                return rng.choice([lo, hi])
            v = rng.randint(int(lo) - 2, int(hi) + 2)
            return round(v + rng.random(), rng.randint(1, 3)) if t == "number" and rng.random() < 0.5 else v
        if t == "string":
            if "format" in s:
                return rng.choice(FORMAT_SAMPLES[s["format"]] + [self.text()])
            return self.text(max(0, s.get("minLength", 0) - 1), s.get("maxLength", 8) + 1)
        if t == "array":
            n = rng.randint(max(0, s.get("minItems", 0) - 1), s.get("maxItems", 4) + 1)
            return [self.doc(s.get("items", {}), depth + 1) for _ in range(n)]
        if t == "object":
            props = s.get("properties")
            if not props:
                extra = s.get("additionalProperties", {})
                return {self.text(1, 3): self.doc(extra, depth + 1) if extra not in (True, {}) else
                        self.anything(depth + 1) for _ in range(rng.randint(0, 3))}
            out = {}
            for k, v in props.items():
                if (k in s.get("required", []) or rng.random() < 0.5) and rng.random() > 0.04:
                    out[k] = self.doc(v, depth + 1)
            if rng.random() < 0.05:
                out["extra"] = 1
            return out
        return self.anything(depth)

    def dump(self, v):
        r = self.rng.random()
        if r < 0.5:
            return json.dumps(v, ensure_ascii=self.rng.random() < 0.5)
        if r < 0.8:
            return json.dumps(v, separators=(",", ":"), ensure_ascii=False)
        return json.dumps(v, indent=2)


def known_spelling(text):
    """Valid documents the grammar refuses on purpose: 3.0 for an integer, and -0.0."""
    return "-0.0" in text or any(text.endswith(".0" + tail) or (".0" + tail) in text
                                 for tail in ("", ",", "}", "]", "\n"))


def judge(schema, docs):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(schema, f)
        path = f.name
    try:
        out = subprocess.run([UNIT, "--match", path], input="".join(json.dumps(d) + "\n" for d in docs),
                             capture_output=True, text=True, timeout=300)
    finally:
        os.unlink(path)
    if out.returncode:
        raise SystemExit("unit_schema --match: %s %s" % (out.stdout, out.stderr))
    verdicts = out.stdout.split()
    assert len(verdicts) == len(docs), (len(verdicts), len(docs))
    return [v == "1" for v in verdicts]


def checked_formats(schema):
    """The schema with properties whose format this jsonschema cannot check taken out (it then
    calls every string valid: "date-time" needs rfc3339-validator, which Debian does not package),
    saying which, so the comparison stays a comparison."""
    known = FormatChecker().checkers
    props = schema.get("properties", {})
    gone = [k for k, v in props.items() if v.get("format") and v["format"] not in known]
    if not gone:
        return schema
    print("reference_schema_jsonschema: this jsonschema cannot check the format(s) %s: properties %s "
          "left out of the comparison" % (sorted({props[k]["format"] for k in gone}), gone))
    return dict(schema, properties={k: v for k, v in props.items() if k not in gone})


def main():
    failures = 0
    made = {}
    for i, schema in enumerate(SCHEMAS):
        schema = checked_formats(schema)
        validator = Draft202012Validator(schema, format_checker=FormatChecker())
        maker = Maker(1000 + i, schema)
        values = [maker.doc(schema) for _ in range(4000)]
        texts = [maker.dump(v) for v in values]
        made[i] = (values, texts)
        valid = [validator.is_valid(v) for v in values]
        accepted = judge(schema, texts)
        n_valid, bad = sum(valid), 0
        for v, text, ok, want in zip(values, texts, accepted, valid):
            if ok and not want:
                bad += 1
                if bad <= 5:
                    print("schema %d: the grammar accepts the invalid %s" % (i, text))
            elif want and not ok and not known_spelling(text):
                bad += 1
                if bad <= 5:
                    print("schema %d: the grammar refuses the valid %s" % (i, text))
        print("schema %d: %d documents, %d valid, %d accepted, %d disagreements" % (
            i, len(texts), n_valid, sum(accepted), bad))
        if n_valid < len(texts) // 20 or n_valid > len(texts) * 19 // 20:
            print("schema %d: too few valid or invalid documents to tell anything" % i)
            bad += 1
        failures += bad
    # negative control: schema 0's grammar over schema 6's documents must disagree with jsonschema
    values, texts = made[6]
    validator = Draft202012Validator(SCHEMAS[6])
    wrong = sum(ok != validator.is_valid(v) for v, ok in zip(values, judge(SCHEMAS[0], texts)))
    print("negative control (schema 0's grammar on schema 6's documents): %d disagreements" % wrong)
    if wrong == 0:
        print("the negative control found no disagreement: the comparison cannot fail")
        failures += 1
    print("reference_schema_jsonschema: %s" % ("FAILED" if failures else "passed"))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
