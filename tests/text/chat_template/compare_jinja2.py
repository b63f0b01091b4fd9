#!/usr/bin/python3
# tests/text/chat_template/compare_jinja2.py — dew's chat templates (core/text/chat_template.cpp) against
# Python's jinja2 (Debian python3-jinja2), through `dew-tokenize render-chat`.
#
#   /usr/bin/python3 compare_jinja2.py DEW_TOKENIZE FIXTURES_DIR WORK_DIR [--count 1000]
#
# For each family folder of FIXTURES_DIR (tokenizer_config.json + chat_template.jinja, written in the
# style of Llama 3 / 3.1, Qwen2 / Qwen3, Mistral and Gemma; dew_default: dew's default template, read
# back with --show-template) it generates --count conversations the family accepts (seeded: system
# prompts, multi-turn, tool calls and tool results, empty contents, unicode and whitespace at the edges,
# reasoning blocks, content parts; syntax: a template of the subset's other constructs), renders them with jinja2 set up as transformers' apply_chat_template
# does (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, the {% generation %}
# tracker, json.dumps-based tojson, raise_exception) and requires dew's output to be equal byte for byte,
# with and without the generation prompt. Then: assistant spans (--spans) against an independent Python
# computation (the generation blocks, or the prefix renderings), conversations the template rejects
# (raise_exception) rejected by dew with the same message, and unsupported syntax refused naming the
# template line. Exit status 0 when everything matches; the first mismatches are printed.
import argparse
import json
import os
import random
import subprocess
import sys

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension
from jinja2.sandbox import ImmutableSandboxedEnvironment


class AssistantTracker(Extension):
    # transformers' {% generation %} extension: records (start, end) of each block in the output.
    tags = {"generation"}

    def __init__(self, environment):
        super().__init__(environment)
        self.rendered = None
        self.spans = None

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(["name:endgeneration"], drop_needle=True)
        return nodes.CallBlock(self.call_method("_support"), [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _support(self, context, caller):
        rv = caller()
        if self.spans is not None:
            start = len("".join(self.rendered))
            self.spans.append((start, start + len(rv)))
        return rv


def make_env():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


ENV = make_env()
TRACKER = next(e for e in ENV.extensions.values() if isinstance(e, AssistantTracker))


def render(template, context):
    """(text, generation spans in code points) or raises."""
    TRACKER.rendered, TRACKER.spans = [], []
    try:
        for block in template.generate(**context):
            TRACKER.rendered.append(block)
        return "".join(TRACKER.rendered), list(TRACKER.spans)
    finally:
        TRACKER.rendered, TRACKER.spans = None, None


def byte_offset(text, index):
    return len(text[:index].encode("utf-8"))


# ---------------------------------------------------------------- conversations

WORDS = ["hello", "world", "the", "answer", "is", "42", "héllo", "naïve", "日本語", "中文", "Ωμέγα", "🎉", "emoji🙂",
         "ascii", "it's", 'say "hi"', "back\\slash", "tab\there", "a{{b}}c", "{% raw %}", "<b>bold</b>", "&amp;",
         "😀😃", "ß", "İ", "x" * 40, "line\nbreak", "cr\r\nlf", "<|im_start|>", "</s>", "[INST]", "null", "true",
         "1.5", "-0", "\u200b", "café"]
EDGES = ["", " ", "  ", "\n", "\n\n", "\t", "\u00a0", "\u3000", " \n ", "\u2003"]


def text(rng, allow_empty=True):
    if allow_empty and rng.random() < 0.08:
        return rng.choice(["", " ", "\n"])
    n = rng.randint(1, 12)
    body = " ".join(rng.choice(WORDS) for _ in range(n))
    if rng.random() < 0.3:
        body = rng.choice(EDGES) + body + rng.choice(EDGES)
    return body


def tool_id(rng):
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789") for _ in range(9))


def arguments(rng, strings_only=False):
    args = {}
    for k in rng.sample(["city", "unit", "query", "count", "flag", "ratio", "tags", "nested"], rng.randint(0, 3)):
        if strings_only:
            args[k] = text(rng, False)
        else:
            args[k] = rng.choice([text(rng), rng.randint(-5, 10**6), rng.random() * 100, True, None,
                                  [1, "two", 3.25], {"inner": text(rng), "n": 7}, 1e-7, 1e20, 0.1])
    return args


def tools(rng):
    out = []
    for _ in range(rng.randint(1, 3)):
        props = {p: {"type": rng.choice(["string", "integer", "number"]), "description": text(rng, False)}
                 for p in rng.sample(["city", "unit", "query", "count"], rng.randint(0, 3))}
        fn = {"name": rng.choice(["get_weather", "search", "calc", "lookup_ünïcode"]),
              "description": text(rng, False),
              "parameters": {"type": "object", "properties": props, "required": list(props)[:1]}}
        if rng.random() < 0.2:
            fn["return"] = {"type": "string"}
        out.append({"type": "function", "function": fn})
    return out


def tool_call(rng, string_arguments=False, strings_only=False):
    args = arguments(rng, strings_only)
    return {"type": "function", "id": tool_id(rng),
            "function": {"name": rng.choice(["get_weather", "search", "calc", "brave_search", "wolfram_alpha"]),
                         "arguments": json.dumps(args) if string_arguments else args}}


def alternating(rng, system_ok=True, turns=None):
    msgs = []
    if system_ok and rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    n = turns if turns is not None else rng.randint(1, 4)
    for t in range(n):
        msgs.append({"role": "user", "content": text(rng)})
        if t < n - 1 or rng.random() < 0.7:
            msgs.append({"role": "assistant", "content": text(rng)})
    return msgs


def gen_llama3(rng):
    return {"messages": alternating(rng)}


def gen_llama3_1(rng):
    conv = {}
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    use_tools = rng.random() < 0.5
    builtin = rng.random() < 0.25
    if use_tools:
        conv["tools"] = tools(rng)
    if builtin:
        conv["builtin_tools"] = rng.sample(["brave_search", "wolfram_alpha", "code_interpreter"], rng.randint(1, 3))
    if rng.random() < 0.3:
        conv["tools_in_user_message"] = rng.random() < 0.5
    if rng.random() < 0.3:
        conv["date_string"] = rng.choice(["01 Jan 2025", "1 déc. 2026"])
    for t in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.4:
            msgs.append({"role": "assistant", "content": "", "tool_calls": [tool_call(rng, strings_only=builtin)]})
            content = rng.choice([text(rng), {"temperature": 21.5, "unit": "C"}, [1, 2], text(rng)])
            msgs.append({"role": rng.choice(["tool", "ipython"]), "content": content})
        msgs.append({"role": "assistant", "content": text(rng)})
    if rng.random() < 0.3:
        msgs.append({"role": "user", "content": text(rng)})
    conv["messages"] = msgs
    return conv


def gen_qwen(rng, qwen3):
    conv = {}
    msgs = []
    if rng.random() < 0.5:
        msgs.append({"role": "system", "content": text(rng)})
    if rng.random() < 0.4:
        conv["tools"] = tools(rng)
    if qwen3 and rng.random() < 0.3:
        conv["enable_thinking"] = rng.random() < 0.5
    for t in range(rng.randint(1, 3)):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.4:
            calls = [tool_call(rng, string_arguments=qwen3 and rng.random() < 0.3) for _ in range(rng.randint(1, 2))]
            msgs.append({"role": "assistant", "content": rng.choice(["", text(rng)]), "tool_calls": calls})
            for _ in range(rng.randint(1, 2)):
                msgs.append({"role": "tool", "content": text(rng)})
            if qwen3 and rng.random() < 0.3:
                msgs.append({"role": "user", "content": "<tool_response>\n" + text(rng) + "\n</tool_response>"})
        if t > 0 and rng.random() < 0.1:
            msgs.append({"role": "system", "content": text(rng)})
        a = {"role": "assistant", "content": text(rng)}
        if qwen3:
            r = rng.random()
            if r < 0.3:
                a["reasoning_content"] = text(rng)
            elif r < 0.6:
                a["content"] = rng.choice(["<think>", "<think>\n", ""]) + text(rng) + rng.choice(["\n", ""]) + \
                    "</think>" + rng.choice(["\n\n", "", "\n"]) + text(rng)
        msgs.append(a)
    if rng.random() < 0.4:
        msgs.append({"role": "user", "content": text(rng)})
    conv["messages"] = msgs
    return conv


def gen_mistral(rng):
    conv = {}
    msgs = []
    if rng.random() < 0.4:
        msgs.append({"role": "system", "content": text(rng)})
    if rng.random() < 0.4:
        conv["tools"] = tools(rng)
    n = rng.randint(1, 3)
    for t in range(n):
        msgs.append({"role": "user", "content": text(rng)})
        if rng.random() < 0.35:
            calls = [tool_call(rng) for _ in range(rng.randint(1, 2))]
            msgs.append({"role": "assistant", "tool_calls": calls})
            for c in calls:
                content = text(rng) if rng.random() < 0.7 else {"content": text(rng)}
                msgs.append({"role": rng.choice(["tool", "tool_results"]), "content": content,
                             "tool_call_id": c["id"]})
        if t < n - 1 or rng.random() < 0.6:
            msgs.append({"role": "assistant", "content": text(rng)})
    if msgs[-1]["role"] == "assistant" and "tool_calls" not in msgs[-1] and rng.random() < 0.3:
        msgs.append({"role": "user", "content": text(rng)})
    conv["messages"] = msgs
    return conv


def gen_gemma(rng):
    msgs = alternating(rng)
    for m in msgs:
        if rng.random() < 0.2:
            parts = []
            for _ in range(rng.randint(1, 3)):
                parts.append({"type": "image"} if rng.random() < 0.3 else {"type": "text", "text": text(rng, False)})
            if m["role"] == "system":
                parts[0] = {"type": "text", "text": text(rng, False)}
            m["content"] = parts
    return {"messages": msgs}


def gen_default(rng):
    msgs = alternating(rng)
    if rng.random() < 0.2:
        msgs.insert(min(len(msgs), 2), {"role": "tool", "content": text(rng)})
    if rng.random() < 0.1:
        msgs.append({"role": "assistant", "content": None})
    return {"messages": msgs}


GENERATORS = {
    "llama3": gen_llama3, "llama3_1": gen_llama3_1, "qwen2": lambda r: gen_qwen(r, False),
    "qwen3": lambda r: gen_qwen(r, True), "mistral": gen_mistral, "gemma": gen_gemma, "dew_default": gen_default,
    "syntax": gen_default,
}

# Conversations each family's template rejects with raise_exception (the message must come back).
BAD = {
    "llama3_1": [{"messages": [{"role": "user", "content": "x"},
                               {"role": "assistant", "tool_calls": [{"function": {"name": "a", "arguments": {}}},
                                                                     {"function": {"name": "b", "arguments": {}}}]}]}],
    "mistral": [{"messages": [{"role": "assistant", "content": "first"}]},
                {"messages": [{"role": "user", "content": "x"},
                              {"role": "assistant", "tool_calls": [{"id": "short", "function": {"name": "a", "arguments": {}}}]}]}],
    "gemma": [{"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]},
              {"messages": [{"role": "user", "content": 5}]}],
}

# Unsupported syntax: (template, the line dew must name).
UNSUPPORTED = [
    ("{% include 'other.jinja' %}", 1),
    ("ok\n{% extends 'base' %}", 2),
    ("a\nb\n{% call f() %}x{% endcall %}", 3),
    ("{% for m in messages %}\n{% filter upper %}x{% endfilter %}\n{% endfor %}", 2),
    ("{{ messages | wordwrap(5) }}", 1),
    ("a\n{{ 'a b' | wordcount }}", 2),
    ("{% raw %}{{ x }}{% endraw %}", 1),
    ("{% if x is divisible %}{% endif %}", 1),
    ("\n\n\n{% for x in y recursive %}{% endfor %}", 4),
    ("{% if true %}\n{% macro f() %}{% endmacro %}\n{% endif %}", 2),
    ("{% break %}", 1),
    ("{{ 'a' % 1 }}", None),  # refused at render time (formatting)
    ("{% if x %}\nno end", 1),
    # past 64-bit integers (Python's are unbounded): refused, not a hang (the power was a loop of 2^63
    # steps), a SIGFPE (the least int64 // -1) or a negative abs
    ("{{ 2 ** 9223372036854775807 }}", None),
    ("{{ (-9223372036854775807 - 1) // -1 }}", None),
    ("{{ (-9223372036854775807 - 1) | abs }}", None),
]


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dew_tokenize")
    ap.add_argument("fixtures")
    ap.add_argument("work")
    ap.add_argument("--count", type=int, default=1000)
    a = ap.parse_args()
    os.makedirs(a.work, exist_ok=True)
    failures = 0
    total = 0

    def report(msg):
        nonlocal failures
        failures += 1
        if failures <= 15:
            print("MISMATCH " + msg)

    for family in sorted(GENERATORS):
        folder = os.path.join(a.fixtures, family)
        shown = run([a.dew_tokenize, "render-chat", "--tokenizer-config", folder, "--show-template"])
        assert shown.returncode == 0, shown.stderr
        source = shown.stdout
        jinja_file = os.path.join(folder, "chat_template.jinja")
        if os.path.exists(jinja_file):
            with open(jinja_file, encoding="utf-8") as f:
                assert f.read() == source, family + ": --show-template differs from chat_template.jinja"
        template = ENV.from_string(source)
        with open(os.path.join(folder, "tokenizer_config.json"), encoding="utf-8") as f:
            cfg = json.load(f)
        specials = {}
        for k in ("bos_token", "eos_token", "unk_token", "pad_token"):
            v = cfg.get(k)
            if isinstance(v, dict):
                v = v["content"]
            if v is not None:
                specials[k] = v
        rng = random.Random("dew-chat-" + family)
        convs = [GENERATORS[family](rng) for _ in range(a.count)]
        path = os.path.join(a.work, family + ".jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for c in convs:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")

        def context(conv, agp):
            ctx = dict(specials)
            ctx.update(conv)
            ctx["add_generation_prompt"] = agp
            return ctx

        for agp in (False, True):
            out = os.path.join(a.work, "%s.%s.out.jsonl" % (family, agp))
            cmd = [a.dew_tokenize, "render-chat", "--tokenizer-config", folder, "--input", path, "--out", out]
            if agp:
                cmd.append("--add-generation-prompt")
            r = run(cmd)
            if r.returncode != 0:
                report("%s agp=%s: dew failed: %s" % (family, agp, r.stderr.strip()))
                continue
            with open(out, encoding="utf-8") as f:
                got = [json.loads(line)["text"] for line in f]
            if len(got) != len(convs):
                report("%s: %d renderings for %d conversations" % (family, len(got), len(convs)))
                continue
            for i, (conv, text_) in enumerate(zip(convs, got)):
                want, _ = render(template, context(conv, agp))
                total += 1
                if text_ != want:
                    report("%s #%d agp=%s\n  jinja2: %r\n  dew:    %r" % (family, i, agp, want, text_))

        # Assistant spans: the generation blocks, or the prefix renderings where they are stable.
        def spans_of(conv):
            text_, gen = render(template, context(conv, False))
            if "{% generation" in source or "{%- generation" in source:
                return text_, [(byte_offset(text_, s), byte_offset(text_, e)) for s, e in gen]
            spans = []
            msgs = conv["messages"]
            for i, m in enumerate(msgs):
                if m["role"] != "assistant":
                    continue
                try:
                    before, _ = render(template, context(dict(conv, messages=msgs[:i]), True))
                except Exception:
                    return text_, None
                upto, _ = render(template, context(dict(conv, messages=msgs[:i + 1]), False))
                b, u, t = before.encode(), upto.encode(), text_.encode()
                if not (u.startswith(b) and t.startswith(u)) or (spans and len(b) < spans[-1][1]):
                    return text_, None
                spans.append((len(b), len(u)))
            return text_, spans

        stable, unstable = [], []
        for c in convs:
            t, s = spans_of(c)
            (stable if s is not None else unstable).append((c, t, s))
        spath = os.path.join(a.work, family + ".spans.jsonl")
        with open(spath, "w", encoding="utf-8") as f:
            for c, _, _ in stable:
                f.write(json.dumps(c, ensure_ascii=False) + "\n")
        sout = spath + ".out"
        r = run([a.dew_tokenize, "render-chat", "--tokenizer-config", folder, "--input", spath, "--out", sout,
                 "--spans"])
        if r.returncode != 0:
            report("%s --spans: dew failed: %s" % (family, r.stderr.strip()))
        else:
            with open(sout, encoding="utf-8") as f:
                got = [json.loads(line) for line in f]
            for i, ((c, t, s), g) in enumerate(zip(stable, got)):
                total += 1
                if g["text"] != t or [tuple(x) for x in g["assistant_spans"]] != s:
                    report("%s spans #%d: jinja2 %r, dew %r" % (family, i, s, g["assistant_spans"]))
        if unstable:
            upath = os.path.join(a.work, family + ".unstable.jsonl")
            with open(upath, "w", encoding="utf-8") as f:
                f.write(json.dumps(unstable[0][0], ensure_ascii=False) + "\n")
            r = run([a.dew_tokenize, "render-chat", "--tokenizer-config", folder, "--input", upath, "--out",
                     upath + ".out", "--spans"])
            total += 1
            if r.returncode != 2:
                report("%s: a conversation without stable prefixes was not refused for --spans (rc %d)" %
                       (family, r.returncode))
        print("%s: %d conversations; spans checked on %d (%d without stable prefixes)" %
              (family, len(convs), len(stable), len(unstable)))

        for k, conv in enumerate(BAD.get(family, [])):
            try:
                render(template, context(conv, False))
                report("%s bad #%d: jinja2 accepted it" % (family, k))
                continue
            except jinja2.exceptions.TemplateError as e:
                message = str(e)
            bpath = os.path.join(a.work, "%s.bad%d.jsonl" % (family, k))
            with open(bpath, "w", encoding="utf-8") as f:
                f.write(json.dumps(conv) + "\n")
            r = run([a.dew_tokenize, "render-chat", "--tokenizer-config", folder, "--input", bpath, "--out",
                     bpath + ".out"])
            total += 1
            if r.returncode != 2 or message not in r.stderr or os.path.exists(bpath + ".out"):
                report("%s bad #%d: want exit 2 with %r, got %d: %s" % (family, k, message, r.returncode, r.stderr))

    # Unsupported syntax: refused, naming the line of chat_template.jinja.
    ufolder = os.path.join(a.work, "unsupported")
    os.makedirs(ufolder, exist_ok=True)
    conv_path = os.path.join(ufolder, "one.jsonl")
    with open(conv_path, "w") as f:
        f.write(json.dumps({"messages": [{"role": "user", "content": "x"}]}) + "\n")
    with open(os.path.join(ufolder, "tokenizer_config.json"), "w") as f:
        f.write("{}")
    for k, (src, line) in enumerate(UNSUPPORTED):
        with open(os.path.join(ufolder, "chat_template.jinja"), "w") as f:
            f.write(src)
        r = run([a.dew_tokenize, "render-chat", "--tokenizer-config", ufolder, "--input", conv_path, "--out",
                 os.path.join(ufolder, "out.jsonl")])
        total += 1
        where = "chat_template.jinja:%d:" % line if line else "chat_template.jinja:"
        if r.returncode != 2 or where not in r.stderr:
            report("unsupported #%d %r: want exit 2 naming %r, got %d: %s" % (k, src, where, r.returncode,
                                                                            r.stderr.strip()))
    print("compare_jinja2: %d checks, %d mismatches" % (total, failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
