#!/usr/bin/env python3
"""Chat-template conformance fixtures for llmkv/jinja.h and llmkv/chat_template.h (run by hand).

Renders each chat template of tests/llmkv/fixtures/chat_templates/templates/ on every conversation
of CONVERSATIONS below, with and without the generation prompt, through transformers' own
rendering (render_jinja_template after _normalize_chat_messages, as tokenizer.apply_chat_template
does: jinja2's ImmutableSandboxedEnvironment with trim_blocks and lstrip_blocks), and writes

  tests/llmkv/fixtures/chat_templates/conversations.json   the conversations (messages, tools, variables)
  tests/llmkv/fixtures/chat_templates/<template>.json      per template: its tokens and, per conversation
                                                           and generation prompt, the text or the error
  tests/llmkv/fixtures/chat_templates/interpreter_cases.json  the interpreter's own cases (one construct,
                                                           filter family, test or method set each)
  llmkv/chat_template_builtin.inc                          the built-in templates' sources, for ChatTemplate::named

Usage (a virtual environment with jinja2 and transformers; no torch needed):
  python3 -m venv /tmp/jinjavenv && /tmp/jinjavenv/bin/pip install jinja2 transformers gguf
  /tmp/jinjavenv/bin/python tools/chat_template_fixtures/make_fixtures.py \
      [--import-sdist llama_cpp_python-0.3.36.tar.gz] [--import-gguf SmolLM2-135M-Instruct.Q4_1.gguf]

--import-sdist / --import-gguf (re)create the template files from where they came from (see
templates/SOURCES.md); without them the committed files are used.
"""
import argparse
import ast
import datetime as _dt
import json
import pathlib
import sys
import tarfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/llmkv/fixtures/chat_templates"
TEMPLATES_DIR = OUT / "templates"
INC = ROOT / "llmkv/chat_template_builtin.inc"

# name, file, bos_token, eos_token (None: the model has none; the template sees it undefined),
# built in (ChatTemplate::named), where the text comes from (in the sdist: a path or a constant).
TEMPLATES = [
    ("chatml", "chatml.jinja", None, "<|im_end|>", True, "llama_cpp/llama_chat_format.py:CHATML_CHAT_TEMPLATE"),
    ("smollm2", "smollm2.jinja", "<|im_start|>", "<|im_end|>", True, "gguf"),
    ("qwen2", "qwen2.jinja", None, "<|im_end|>", True, "literal"),
    ("qwen2.5", "qwen2.5.jinja", None, "<|im_end|>", True, "vendor/llama.cpp/models/templates/Qwen-Qwen2.5-7B-Instruct.jinja"),
    ("llama3", "llama3.jinja", "<|begin_of_text|>", "<|eot_id|>", True,
     "llama_cpp/llama_chat_format.py:LLAMA3_INSTRUCT_CHAT_TEMPLATE"),
    ("llama3.1", "llama3.1.jinja", "<|begin_of_text|>", "<|eot_id|>", True,
     "vendor/llama.cpp/models/templates/meta-llama-Llama-3.1-8B-Instruct.jinja"),
    ("llama3.2", "llama3.2.jinja", "<|begin_of_text|>", "<|eot_id|>", False,
     "vendor/llama.cpp/models/templates/meta-llama-Llama-3.2-3B-Instruct.jinja"),
    ("qwen3", "qwen3.jinja", None, "<|im_end|>", False, "vendor/llama.cpp/models/templates/Qwen-Qwen3-0.6B.jinja"),
    ("hermes2pro", "hermes2pro.jinja", "<|begin_of_text|>", "<|im_end|>", False,
     "vendor/llama.cpp/models/templates/NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja"),
    ("mistral-nemo", "mistral-nemo.jinja", "<s>", "</s>", False,
     "vendor/llama.cpp/models/templates/mistralai-Mistral-Nemo-Instruct-2407.jinja"),
    ("phi3.5", "phi3.5.jinja", "<s>", "<|endoftext|>", False,
     "vendor/llama.cpp/models/templates/microsoft-Phi-3.5-mini-instruct.jinja"),
    ("gemma2", "gemma2.jinja", "<bos>", "<eos>", False, "vendor/llama.cpp/models/templates/google-gemma-2-2b-it.jinja"),
    ("deepseek-r1-qwen", "deepseek-r1-qwen.jinja", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", False,
     "vendor/llama.cpp/models/templates/deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"),
]

# Qwen/Qwen2-7B-Instruct's tokenizer_config.json chat_template (no PyPI package found to ship it;
# see templates/SOURCES.md).
QWEN2_TEMPLATE = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}{% endif %}"
    "{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# strftime_now() renders this moment (Python's datetime.now is replaced; the C++ test passes the
# same instant, 2024-07-26 12:00 UTC, which is 26 Jul 2024 in every time zone within +-11 h).
FIXED_NOW = _dt.datetime(2024, 7, 26, 12, 0, 0)
FIXED_NOW_UNIX = 1721995200

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city — «Unicode» too",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "The city, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "description": "Unit"},
                "days": {"type": "integer", "description": "Days ahead", "minimum": 0, "maximum": 7.5},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web",
        "parameters": {"type": "object", "properties": {"query": {"type": "string", "description": "Terms"},
                                                        "safe": {"type": "boolean", "description": "Safe", "default": True},
                                                        "tags": {"type": ["string", "null"], "description": "Tags"}},
                       "required": ["query"]},
        "return": {"type": "string", "description": "The results"},
    },
}


def m(role, content, **extra):
    d = {"role": role, "content": content}
    d.update(extra)
    return d


def tool_call(name, arguments, call_id="call12345"):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


SYS = m("system", "You are a careful assistant.")
CONVERSATIONS = [
    ("user_only", [m("user", "Hello!")]),
    ("system_user", [SYS, m("user", "What is 2+2?")]),
    ("multi_turn", [SYS, m("user", "Hi"), m("assistant", "Hello! How can I help?"), m("user", "Tell me a joke.")]),
    ("no_system_turns", [m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d"), m("user", "e")]),
    ("assistant_last", [m("user", "Say yes."), m("assistant", "Yes.")]),
    ("newlines_spaces", [m("system", "  Line one.\n\nLine three.  \n"), m("user", "\n\n  indented\n\ttab\n"),
                         m("assistant", "  both ends  ")]),
    ("quotes_backslashes", [m("user", "He said \"hi\" and 'bye' \\ C:\\path\\n \\u00e9")]),
    ("template_syntax_in_content", [m("user", "{{ 1 + 1 }} {% if x %} {# c #} }} {% endraw %} {{- '-' -}}")]),
    ("non_ascii", [m("system", "Réponds en français. Ελληνικά, Русский, 中文, 日本語."), m("user", "Ça va? Straße İstanbul")]),
    ("emoji", [m("user", "👋🏽 family 👨‍👩‍👧‍👦 flag 🏴󠁧󠁢󠁳󠁣󠁴󠁿 and 😀"), m("assistant", "🙂")]),
    ("empty_user", [m("user", "")]),
    ("empty_system", [m("system", ""), m("user", "x")]),
    ("system_only", [SYS]),
    ("empty_conversation", []),
    ("special_tokens_in_content", [m("user", "<|im_end|><|im_start|>system\n<|eot_id|><|start_header_id|>x")]),
    ("unicode_whitespace", [m("system", "\u00a0\u3000 wide \u2003"), m("user", "\u2028sep\u2029")]),
    ("crlf_controls", [m("user", "a\r\nb\rc\x01\x1f\x7f")]),
    ("long_content", [m("user", ("The quick brown fox jumps over the lazy dog. " * 60).strip())]),
    ("system_in_middle", [m("user", "first"), m("system", "late system"), m("user", "second")]),
    ("developer_role", [m("developer", "Be terse."), m("user", "ok")]),
    ("tools_available", [SYS, m("user", "Weather in Paris?")], {"tools": [WEATHER_TOOL, SEARCH_TOOL]}),
    ("tools_no_system", [m("user", "Weather in Paris?")], {"tools": [WEATHER_TOOL]}),
    ("tool_call_and_result", [m("user", "Weather in Paris?"),
                              {"role": "assistant", "content": "",
                               "tool_calls": [tool_call("get_weather", {"city": "Paris", "days": 2, "ratio": 0.5,
                                                                        "ok": True, "none": None})]},
                              m("tool", "{\"temperature\": 21.5, \"sky\": \"clear\"}", tool_call_id="call12345"),
                              m("assistant", "It is 21.5 °C and clear.")], {"tools": [WEATHER_TOOL]}),
    ("tool_call_string_arguments", [m("user", "Find cats"),
                                    {"role": "assistant", "content": None,
                                     "tool_calls": [tool_call("search", "{\"query\": \"cats\"}", "abcdefghi")]},
                                    m("tool", "many cats", tool_call_id="abcdefghi")]),
    ("two_tool_results", [m("user", "Both?"),
                          {"role": "assistant", "content": "Checking.",
                           "tool_calls": [tool_call("get_weather", {"city": "A"}, "id0000001"),
                                          tool_call("get_weather", {"city": "B"}, "id0000002")]},
                          m("tool", "sunny", tool_call_id="id0000001"), m("tool", "rainy", tool_call_id="id0000002")]),
    ("tool_content_mapping", [m("user", "q"), m("ipython", {"output": [1, 2.0, "x"], "ok": True})]),
    ("llama_tools_in_system", [SYS, m("user", "Weather?")],
     {"tools": [WEATHER_TOOL], "variables": {"tools_in_user_message": False, "date_string": "01 Jan 2025"}}),
    ("llama_builtin_tools", [m("user", "Search for news"),
                             {"role": "assistant", "content": "",
                              "tool_calls": [tool_call("brave_search", {"query": "news"})]},
                             m("ipython", "results")], {"variables": {"builtin_tools": ["brave_search", "wolfram_alpha"]}}),
    ("thinking", [m("user", "Think first."), m("assistant", "<think>\nsome reasoning\n</think>\n\nThe answer."),
                  m("user", "Again")], {"variables": {"enable_thinking": False}}),
    ("reasoning_field", [m("user", "q1"), m("assistant", "a1", reasoning_content="because"), m("user", "q2")]),
]


# The interpreter's own cases (tests/llmkv/test_jinja.cpp): one construct or family of filters,
# tests or methods each, rendered with INTERPRETER_VARIABLES.
INTERPRETER_VARIABLES = {"m": {"role": "user", "content": "hi"}, "xs": [3, 1, 2], "s": "  Hello World  ", "n": None, "f": 2.5, "msgs": [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}]}
INTERPRETER_CASES = [
 # whitespace control
 ("ws_trim_blocks", "{% if true %}\nA\n{% endif %}\nB"),
 ("ws_lstrip_blocks", "x\n    {% if true %}\n    y\n    {% endif %}\nz"),
 ("ws_minus", "a  {{- 'b' -}}  c\n  {%- if true %} d {% endif -%}  \n e"),
 ("ws_plus", "a\n  {%+ if true %}b{% endif +%}\nc"),
 ("ws_comment", "a\n  {# note #}\nb{#- x -#}  c"),
 ("ws_var_no_lstrip", "  {{ 'v' }}\n  {% if true %}w{% endif %}"),
 ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\nc\n"),
 ("raw", "{% raw %}{{ x }} {% if %}{% endraw %}|{%- raw -%}  keep  {%- endraw %}|"),
 # literals
 ("lit_strings", "{{ 'a\\tb' }}|{{ \"q'\" }}|{{ 'x' 'y' }}|{{ '\\x41\\u00e9\\U0001F600\\101\\z' }}"),
 ("lit_numbers", "{{ 1_000 }}|{{ 0x1f }}|{{ 0o17 }}|{{ 0b101 }}|{{ 1.5e3 }}|{{ 2.0 }}|{{ 1e-7 }}|{{ 1e16 }}|{{ 123.456 }}"),
 ("lit_containers", "{{ [1, 'a', none, true, 2.5] }}|{{ (1,) }}|{{ () }}|{{ {'k': [1, {'n': none}], 2: 'two'} }}"),
 ("lit_repr_quotes", "{{ [\"it's\", 'say \"x\"', 'both \\' \"', 'tab\\t', 'nl\\n'] }}"),
 # operators
 ("op_arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 2 ** 3 ** 2 }}"),
 ("op_float", "{{ 0.1 + 0.2 }} {{ 7.5 // 2 }} {{ -7.5 % 2 }} {{ 1 / 3 }} {{ 10 / 5 }} {{ true + true }}"),
 ("op_strings", "{{ 'a' + 'b' }} {{ 'ab' * 3 }} {{ 2 * [0] }} {{ [1] + [2] }} {{ 'x' ~ 1 ~ none ~ 2.0 ~ [1] }}"),
 ("op_compare", "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ 1 == 1.0 }} {{ true == 1 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ (1, 2) == [1, 2] }} {{ {'a': 1} == {'a': 1.0} }} {{ none == none }} {{ 2 >= 2 }} {{ 'é' > 'z' }}"),
 ("op_logic", "{{ 0 or 'x' }} {{ 0 and 'x' }} {{ 'a' and 'b' }} {{ [] or {} }} {{ not 0 }} {{ not not 'x' }} {{ 1 in [1, 2] }} {{ 3 not in [1] }} {{ 'ell' in 'hello' }} {{ 'k' in {'k': 1} }} {{ not 1 in [1] }}"),
 ("op_cond", "{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}[{{ 'y' if 0 }}]{{ 1 if 0 else 2 if 0 else 3 }}"),
 ("op_precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ -2 ** 2 }} {{ 'a' + ' b '|trim + 'c' }} {{ 2 * 3 ~ 4 }} {{ 1 ~ 2 + 3 ~ 4 }}"),
 # access
 ("access", "{{ m.role }}{{ m['content'] }}{{ m.missing }}|{{ xs[0] }}{{ xs[-1] }}{{ xs[9] }}|{{ msgs[1].content }}|{{ none.x }}|{{ 'abc'[1] }}{{ 'héllo'[1] }}{{ xs.0 }}"),
 ("slices", "{{ xs[1:] }}{{ xs[:-1] }}{{ xs[::-1] }}{{ xs[::2] }}{{ 'héllo'[1:3] }}{{ 'abc'[::-1] }}{{ xs[5:] }}{{ xs[-10:1] }}"),
 # statements
 ("if_elif", "{% for i in [1, 2, 3] %}{% if i == 1 %}one{% elif i == 2 %}two{% else %}many{% endif %},{% endfor %}"),
 ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}{{ loop.first }}{{ loop.last }}{{ loop.length }}{{ loop.previtem }}{{ loop.nextitem }}{{ loop.cycle('o', 'e') }};{% endfor %}"),
 ("for_else_filter", "{% for x in [] %}a{% else %}empty{% endfor %}|{% for x in xs if x > 1 %}{{ x }}{{ loop.index }}/{{ loop.length }} {% endfor %}"),
 ("for_unpack_dict", "{% for k, v in m.items() %}{{ k }}={{ v }};{% endfor %}{% for k in m %}{{ k }}{% endfor %}{% for a, b in [[1, 2], 'xy'] %}{{ a }}{{ b }}{% endfor %}"),
 ("for_break_continue", "{% for i in range(10) %}{% if i is even %}{% continue %}{% endif %}{% if i > 6 %}{% break %}{% endif %}{{ i }}{% endfor %}"),
 ("scoping", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }};{% endfor %}{{ x }}{% if true %}{% set y = 5 %}{% endif %}{{ y }}"),
 ("namespace", "{% set ns = namespace(total=0, seen=none) %}{% for i in xs %}{% set ns.total = ns.total + i %}{% set ns.seen = i %}{% endfor %}{{ ns.total }} {{ ns.seen }} {{ ns }}"),
 ("set_forms", "{% set a, b = 1, 2 %}{{ a }}{{ b }}{% set t = 1, 2 %}{{ t }}{% set blk %} <{{ a }}> {% endset %}[{{ blk }}]{% set up | upper | trim %} q {% endset %}[{{ up }}]"),
 ("macros", "{% macro tag(name, body='', close=true) %}<{{ name }}>{{ body }}{% if close %}</{{ name }}>{% endif %}{% endmacro %}{{ tag('b', 'x') }}{{ tag('i', close=false) }}{{ tag(body='z', name='u') }}"),
 ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(10) }}"),
 ("filter_block", "{% filter upper %}abc {{ 'd' }}{% endfilter %}|{% filter replace('a', 'o') | title %}banana split{% endfilter %}"),
 ("generation", "{% generation %}kept{% endgeneration %}"),
 # filters
 ("f_text", "{{ s|trim }}|{{ 'xxaxx'|trim('x') }}|{{ s|upper }}|{{ s|lower }}|{{ 'hELLO wORLD'|capitalize }}|{{ 'hello-world (x)[y]<z>'|title }}|{{ 'aaa'|replace('a', 'b', 2) }}|{{ 'abc'|reverse }}"),
 ("f_length_default", "{{ 'héllo'|length }} {{ xs|length }} {{ m|count }} {{ missing|length }} {{ missing|default('d') }} {{ ''|default('e', true) }} {{ n|default('f') }} {{ n|d('g', true) }}"),
 ("f_lists", "{{ xs|sort }} {{ xs|sort(reverse=true) }} {{ ['b', 'A', 'a']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} {{ xs|first }} {{ xs|last }} {{ xs|sum }} {{ xs|max }} {{ xs|min }} {{ [1, 1, 'a', 'A']|unique|list }} {{ xs|reverse|list }} {{ 'ab'|list }}"),
 ("f_join_map_select", "{{ xs|join(', ') }}|{{ msgs|map(attribute='role')|join('+') }}|{{ msgs|selectattr('role', 'equalto', 'user')|list }}|{{ msgs|rejectattr('role', 'eq', 'user')|map(attribute='content')|list }}|{{ xs|select('odd')|list }}|{{ [0, 1, '', 'x']|select|list }}|{{ ['a', 'b']|map('upper')|list }}|{{ xs|reject('gt', 1)|list }}"),
 ("f_items_dictsort", "{{ m|items|list }}|{{ {'b': 2, 'A': 1, 'a': 3}|dictsort }}|{{ {'b': 2, 'a': 1}|dictsort(by='value', reverse=true) }}"),
 ("f_numbers", "{{ '42'|int }} {{ '3.9'|int }} {{ 'x'|int(7) }} {{ '0x1A'|int(0, 16) }} {{ 3.99|int }} {{ ' 12 '|int }} {{ '2.5'|float }} {{ 'abc'|float }} {{ -3|abs }} {{ '1_000'|int }}"),
 ("f_tojson", "{{ {'b': 1, 'a': [1, 2.5, none, true, 'é\"\\n\\t\\u0001']}|tojson }}|{{ [1, {'a': {}}, []]|tojson(indent=2) }}|{{ {'b': 1, 'a': 2}|tojson(sort_keys=true) }}|{{ 'é😀'|tojson(ensure_ascii=true) }}|{{ [1, 2]|tojson(separators=(',', ':')) }}|{{ 1e-7|tojson }}"),
 ("f_indent_string", "{{ 'a\\nb\\n\\nc'|indent(2) }}|{{ 'a\\nb'|indent(2, true) }}|{{ 'a\\n\\nb'|indent('> ', blank=true) }}|{{ [1, 'x']|string }}|{{ 5|string }}|{{ '<a href=\"x\">&\\''|escape }}|{{ 'x'|safe }}"),
 # tests
 ("tests", "{{ 1 is odd }}{{ 2 is even }}{{ 9 is divisibleby 3 }}{{ 'AB' is upper }}{{ 'ab' is lower }}{{ missing is defined }}{{ missing is undefined }}{{ n is none }}{{ 1 is number }}{{ true is number }}{{ 1 is integer }}{{ true is integer }}{{ 1.0 is float }}{{ true is boolean }}{{ 'a' is string }}{{ m is mapping }}{{ xs is iterable }}{{ 'a' is iterable }}{{ 3 is iterable }}{{ missing is iterable }}{{ 'x' is sequence }}{{ 2 is in [1, 2] }}{{ 1 is eq 1 }}{{ 1 is ne 2 }}{{ 1 is lt 2 }}{{ 1 is gt 2 }}{{ 'upper' is filter }}{{ none is not none }}{{ true is true }}{{ 0 is false }}"),
 # methods
 ("str_methods", "{{ s.strip() }}|{{ s.lstrip() }}|{{ s.rstrip() }}|{{ 'xxhixx'.strip('x') }}|{{ ' a  b '.split() }}|{{ 'a,b,,c'.split(',') }}|{{ 'a,b,c'.split(',', 1) }}|{{ 'a,b,c'.rsplit(',', 1) }}|{{ '  a b  c  '.split(None, 1) }}|{{ '  a b  c  '.rsplit(None, 1) }}|{{ 'x\\u3000y'.split() }}"),
 ("str_methods2", "{{ 'abc'.startswith('ab') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Hi'.upper() }}{{ 'Hi'.lower() }}{{ \"they're bill's\".title() }}{{ 'hELLO'.capitalize() }}{{ 'aXbX'.replace('X', '-') }}{{ 'héllo'.find('l') }}{{ 'abc'.find('z') }}{{ 'banana'.count('an') }}{{ '-'.join(['a', 'b']) }}{{ 'a\\nb\\r\\nc'.splitlines() }}{{ '12'.isdigit() }}{{ 'ab'.isalpha() }}"),
 ("str_format", "{{ '{} and {}'.format('a', 1) }}|{{ '{0}{1}{0}'.format('x', 'y') }}|{{ '{name}!'.format(name='N') }}|{{ '{{}} {!r}'.format('q') }}|{{ '%s is %d%%' % ('x', 5) }}|{{ '%(a)s' % {'a': 1} }}"),
 ("dict_methods", "{{ m.get('role') }} {{ m.get('zz') }} {{ m.get('zz', 5) }} {{ m.keys()|list }} {{ m.values()|list }} {{ m.items()|list }}"),
 ("globals", "{{ range(3)|list }} {{ range(1, 7, 2)|list }} {{ range(5, 0, -2)|list }} {{ dict(a=1, b=2) }} {{ dict([('x', 1)]) }} {{ namespace(a=1).a }}"),
 ("unicode_case", "{{ 'ÀÉÎõü ÿ ĀĂ Ω αβγ Жд ß'|upper }}|{{ 'ÀÉÎõü Ÿ ĀĂ Ω ΑΣ ΣΑ Жд İ'|lower }}"),
 ("py_whitespace_trim", "[{{ '\\u00a0\\u2003x\\u3000\\u2028'|trim }}][{{ '\\x1c y \\x85'.strip() }}]"),
]
INTERPRETER_ERRORS = [  # jinja2 raises on each
 ("e_undefined_attr", "{{ missing.x }}"),
 ("e_undefined_item", "{{ missing['x'] }}"),
 ("e_type_add", "{{ 1 + 'a' }}"),
 ("e_raise", "line1\n{{ raise_exception('boom: ' ~ 42) }}"),
 ("e_call_undefined", "{{ nothing() }}"),
 ("e_iterate_none", "{% for x in n %}{% endfor %}"),
 ("e_div_zero", "{{ 1 / 0 }}"),
 ("e_unpack", "{% for a, b in [[1, 2, 3]] %}{% endfor %}"),
 ("e_range", "{{ range(200000)|length }}"),
 ("e_mutate", "{{ xs.append(4) }}"),
 ("e_compare", "{{ 1 < 'a' }}"),
 ("e_precedence", "{{ 1 + 2 ~ 3 }}"),
 ("e_ns_underscore", "{% set ns = namespace() %}{% set ns._x = 1 %}"),
 ("e_json", "{{ missing|tojson }}"),
 ("e_macro_args", "{% macro f(a) %}{% endmacro %}{{ f(1, 2) }}"),
]


class FixedDatetime(_dt.datetime):
    @classmethod
    def now(cls, tz=None):
        return FIXED_NOW


def import_sources(sdist, gguf_path):
    TEMPLATES_DIR.mkdir(parents=True, exist_ok=True)
    members = {}
    if sdist:
        with tarfile.open(sdist) as tar:
            for t in tar.getmembers():
                members["/".join(t.name.split("/")[1:])] = t
            for name, file, _, _, _, origin in TEMPLATES:
                path, _, const = origin.partition(":")
                if path not in members:
                    continue
                text = tar.extractfile(members[path]).read().decode("utf-8")
                if const:
                    tree = ast.parse(text)
                    text = next(n.value.value for n in tree.body
                                if isinstance(n, ast.Assign) and n.targets[0].id == const)
                (TEMPLATES_DIR / file).write_bytes(text.encode("utf-8"))
    if gguf_path:
        from gguf import GGUFReader
        text = GGUFReader(gguf_path).fields["tokenizer.chat_template"].contents()
        (TEMPLATES_DIR / "smollm2.jinja").write_bytes(text.encode("utf-8"))
    (TEMPLATES_DIR / "qwen2.jinja").write_bytes(QWEN2_TEMPLATE.encode("utf-8"))


def render_one(render, template, conv, add_generation_prompt, bos, eos):
    from transformers.utils.chat_template_utils import _normalize_chat_messages
    messages, tools, variables = conv["messages"], conv.get("tools"), dict(conv.get("variables", {}))
    if bos is not None:
        variables["bos_token"] = bos
    if eos is not None:
        variables["eos_token"] = eos
    try:
        (text,), _ = render([_normalize_chat_messages(messages)], tools=tools, chat_template=template,
                            add_generation_prompt=add_generation_prompt, **variables)
        return {"text": text}
    except Exception as e:  # the C++ side must fail too
        return {"error": f"{type(e).__name__}: {e}"}


def write_inc(sources):
    lines = ["// Generated by tools/chat_template_fixtures/make_fixtures.py from",
             "// tests/llmkv/fixtures/chat_templates/templates/ (see SOURCES.md there); do not edit.",
             "// {name, bos_token (nullptr: none), eos_token, source}"]
    for name, bos, eos, text in sources:
        assert ")tmpl\"" not in text
        b = "nullptr" if bos is None else json.dumps(bos, ensure_ascii=False)
        lines.append(f'{{"{name}", {b}, {json.dumps(eos, ensure_ascii=False)}, R"tmpl({text})tmpl"}},')
    INC.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--import-sdist", help="llama_cpp_python-0.3.36.tar.gz from PyPI")
    ap.add_argument("--import-gguf", help="SmolLM2-135M-Instruct.Q4_1.gguf (tools/get_model.sh smollm2)")
    args = ap.parse_args()
    if args.import_sdist or args.import_gguf:
        import_sources(args.import_sdist, args.import_gguf)

    import jinja2
    import transformers
    from transformers.utils import chat_template_utils
    chat_template_utils.datetime = FixedDatetime  # strftime_now's clock
    render = chat_template_utils.render_jinja_template

    convs = []
    for entry in CONVERSATIONS:
        name, messages = entry[0], entry[1]
        extra = entry[2] if len(entry) > 2 else {}
        conv = {"name": name, "messages": messages}
        if "tools" in extra:
            conv["tools"] = extra["tools"]
        if "variables" in extra:
            conv["variables"] = extra["variables"]
        convs.append(conv)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "conversations.json").write_text(json.dumps(convs, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")

    builtin = []
    for name, file, bos, eos, is_builtin, _ in TEMPLATES:
        template = (TEMPLATES_DIR / file).read_bytes().decode("utf-8")
        renders, errors = [], 0
        for conv in convs:
            for gen in (False, True):
                r = render_one(render, template, conv, gen, bos, eos)
                errors += "error" in r
                renders.append({"conversation": conv["name"], "add_generation_prompt": gen, **r})
        fixture = {"template": f"templates/{file}", "bos_token": bos, "eos_token": eos, "now_unix": FIXED_NOW_UNIX,
                   "made_with": {"jinja2": jinja2.__version__, "transformers": transformers.__version__,
                                 "python": sys.version.split()[0]},
                   "renders": renders}
        (OUT / f"{name}.json").write_text(json.dumps(fixture, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
        print(f"{name}: {len(renders)} renders ({errors} errors)")
        if is_builtin:
            builtin.append((name, bos, eos, template))
    write_inc(builtin)
    write_interpreter_cases()


def write_interpreter_cases():
    from transformers.utils.chat_template_utils import _compile_jinja_template
    cases = []
    for name, template in INTERPRETER_CASES:
        cases.append({"name": name, "template": template,
                      "text": _compile_jinja_template(template).render(**INTERPRETER_VARIABLES)})
    for name, template in INTERPRETER_ERRORS:
        try:
            _compile_jinja_template(template).render(**INTERPRETER_VARIABLES)
            raise SystemExit(f"{name}: jinja2 rendered it; it belongs in INTERPRETER_CASES")
        except Exception as e:  # noqa: BLE001 (any failure is what the case records)
            cases.append({"name": name, "template": template, "error": f"{type(e).__name__}: {e}"})
    doc = {"variables": INTERPRETER_VARIABLES, "cases": cases}
    (OUT / "interpreter_cases.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"interpreter_cases: {len(cases)} cases")


if __name__ == "__main__":
    main()
