"""ctest `reference_chat_template`: orochi's Jinja interpreter (model/jinja.c) against Python's jinja2.

The real chat templates of model files (tests/data/templates: Qwen2.5, Llama 3.1 / 3.2 / 3.3,
DeepSeek-R1 distills of Qwen and Llama, Gemma 2, Phi-3.5, Qwen3, Mistral v1 / v3 / v3-tekken (Nemo)
/ v7, SmolLM2) are rendered for conversations of one to five turns (system, user, assistant; text
with newlines, quotes, non-ASCII and surrounding spaces), and for conversations with tools, tool
calls and tool results, reasoning and enable_thinking, and no generation prompt (passed as a JSON
object of the template's variables) by jinja2 set up as Hugging Face's apply_chat_template sets it up
(a sandboxed environment with trim_blocks and lstrip_blocks, raise_exception, strftime_now, a
tojson that keeps non-ASCII text) and by `orochi tokenize --chat-template T --render-chat
MESSAGES` over a model made here; the texts must be the same bytes. Where a template refuses a
conversation (raise_exception: Gemma's system role, Mistral's alternation), orochi must refuse it
too, exit 2, with the template's message. Templates with a construct the interpreter does not
run must say which (a made-up {% macro %} template here).

Environment: OROCHI_BIN, OROCHI_TMP, OROCHI_SOURCE (as set by ctest). Exit 0 pass, 1 fail, 77 skip
(jinja2 missing).
"""
import datetime
import glob
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.environ.get("OROCHI_SOURCE", os.path.dirname(os.path.dirname(HERE)))
OROCHI_BIN = os.environ.get("OROCHI_BIN", os.path.join(SOURCE, "build", "bin", "orochi"))
TMP = os.environ.get("OROCHI_TMP", "/tmp")

try:
    import jinja2
    from jinja2.sandbox import ImmutableSandboxedEnvironment
except ImportError:
    print("reference_chat_template: SKIPPED: python3-jinja2 is not installed "
          "(deploy/install-deps.sh installs it)")
    sys.exit(77)

CONVERSATIONS = [
    [("user", "Hello!")],
    [("system", "You are terse."), ("user", "What is 2+2?")],
    [("user", "Hi"), ("assistant", "Hello! How can I help?"), ("user", "Tell me a joke.")],
    [("system", "Be kind."), ("user", "  spaced out  "), ("assistant", "Sure:\n- one\n- two"),
     ("user", "Quote 'this' and \"that\""), ("assistant", "Done.")],
    [("system", "Réponds en français, s'il te plaît."), ("user", "Ça va ? 日本語も"),
     ("assistant", "Oui !\n\n"), ("user", "Merci\n")],
]


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather now in a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \u00c9vry"},
        "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}}
CALL = {"id": "call12345", "type": "function",
        "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}
# Variables beyond role/content (tools, tool calls and results, reasoning, enable_thinking),
# given to `orochi tokenize --render-chat` as a JSON object of the template's variables.
VARIABLE_CASES = [
    ("tools", {"tools": [WEATHER], "messages": [
        {"role": "system", "content": "You help with weather."},
        {"role": "user", "content": "Weather in Paris?"}]}),
    ("tool call and result", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [CALL]},
        {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
         "content": "{\"temp\": 21, \"sky\": \"clear\"}"}]}),
    ("arguments as text", {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "And in Lyon?"},
        {"role": "assistant", "content": "Let me look.", "tool_calls": [
            {"id": "callABCDE", "type": "function", "function": {
                "name": "get_weather", "arguments": "{\"city\": \"Lyon\"}"}}]},
        {"role": "tool", "tool_call_id": "callABCDE", "content": "18 degrees"},
        {"role": "assistant", "content": "It is 18 degrees in Lyon."},
        {"role": "user", "content": "Thanks \U0001F600"}]}),
    ("reasoning, thinking off", {"enable_thinking": False, "messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4"},
        {"role": "user", "content": "3*3?"}]}),
    ("no generation prompt", {"add_generation_prompt": False, "messages": [
        {"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello."}]}),
]


def hf_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.now().strftime(fmt)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render_both(tmpl, path, model, msgs_path, variables, as_object, bos, eos):
    """The template rendered by jinja2 and by `orochi tokenize --render-chat` (the variables as a
    JSON object, or just the messages as an array): None when both give the same bytes or both
    refuse with the template's message, else what differs."""
    args = {"add_generation_prompt": True, **variables}
    try:
        want, raised = tmpl.render(bos_token=bos, eos_token=eos, **args), None
    except jinja2.exceptions.TemplateError as exc:
        want, raised = None, str(exc)
    with open(msgs_path, "w", encoding="utf-8") as f:
        json.dump(variables if as_object else variables["messages"], f, ensure_ascii=False)
    p = subprocess.run([OROCHI_BIN, "tokenize", "--model", model, "--chat-template", path,
                        "--render-chat", msgs_path], capture_output=True, timeout=60)
    got, err = p.stdout.decode("utf-8", "replace"), p.stderr.decode("utf-8", "replace")
    if raised is not None:
        if p.returncode == 2 and raised in err:
            return None
        return "jinja2 raised %r; orochi exit %d, %r" % (raised, p.returncode, err.strip()[-200:])
    if p.returncode == 0 and got == want:
        return None
    at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
    return "exit %d %s; first difference at byte %d: orochi %r, jinja2 %r" % (
        p.returncode, err.strip()[-200:], at, got[max(0, at - 20):at + 30],
        want[max(0, at - 20):at + 30])


def main():
    os.makedirs(TMP, exist_ok=True)
    model = os.path.join(TMP, "chat_template_vocab.gguf")
    subprocess.run([OROCHI_BIN, "mkmodel", "--out", model, "--layers", "1", "--dim", "64",
                    "--ffn", "64", "--heads", "2", "--kv-heads", "2", "--vocab", "300", "--ctx",
                    "64", "--type", "f32"], check=True, capture_output=True)
    bos, eos = "", "<|im_end|>"  # mkmodel's vocabulary: no BOS, eos <|im_end|>
    env = hf_env()
    failures, checks = [], 0
    templates = sorted(glob.glob(os.path.join(SOURCE, "tests", "data", "templates", "*.jinja")))
    if not templates:
        print("reference_chat_template: no templates in tests/data/templates")
        return 1
    msgs_path = os.path.join(TMP, "chat_template_msgs.json")
    tmpl_path = None
    for path in templates:
        name = os.path.basename(path)[:-6]
        text = open(path, encoding="utf-8").read()
        tmpl = env.from_string(text)
        same = 0
        # plain conversations go to orochi as an array of messages, the others as an object of
        # the template's variables
        cases = [("/".join(r for r, _ in conv), {"messages": [{"role": r, "content": c}
                                                              for r, c in conv]}, False)
                 for conv in CONVERSATIONS] + [(c, v, True) for c, v in VARIABLE_CASES]
        for label, variables, as_object in cases:
            checks += 1
            failure = render_both(tmpl, path, model, msgs_path, variables, as_object, bos, eos)
            if failure:
                failures.append("%s, %s: %s" % (name, label, failure))
            else:
                same += 1
        total = len(CONVERSATIONS) + len(VARIABLE_CASES)
        print("  %-45s %d/%d conversations the same" % (name, same, total), flush=True)
    # a construct the interpreter does not run is named
    tmpl_path = os.path.join(TMP, "chat_template_macro.jinja")
    with open(tmpl_path, "w") as f:
        f.write("{% macro turn(m) %}{{ m['content'] }}{% endmacro %}"
                "{% for m in messages %}{{ turn(m) }}{% endfor %}")
    with open(msgs_path, "w") as f:
        json.dump([{"role": "user", "content": "hi"}], f)
    p = subprocess.run([OROCHI_BIN, "tokenize", "--model", model, "--chat-template", tmpl_path,
                        "--render-chat", msgs_path], capture_output=True, timeout=60)
    checks += 1
    err = p.stderr.decode(errors="replace")
    if p.returncode != 2 or "'macro' is not supported" not in err:
        failures.append("a macro template: exit %d, %r (want exit 2 naming 'macro')"
                        % (p.returncode, err.strip()))
    else:
        print("  a {%% macro %%} template is refused: %s" % err.strip())
    for f in (model, msgs_path, tmpl_path):
        os.unlink(f)
    print("reference_chat_template: %d checks, %d failures" % (checks, len(failures)))
    for f in failures:
        print("FAIL: " + f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
