# One template a line reads (and diffs) better than a wrapped one: long lines are kept here.
# ruff: noqa: E501
"""Which chat templates loop over a message's content, as vLLM's server decides it.

Each template below is read by the platform (models_registry.content_format) and by vLLM's own
detection of its "auto" content format; the two must agree. They cover each way the reading
follows names (loops over the conversation, names set from it, filters and slices, macros fed a
message's content by position or keyword, a bare `content`) and the ways it gives up (tuple and
namespace targets, a template that does not parse). Add a case by adding a line.
"""

from __future__ import annotations

import pytest

from models_registry.content_format import reads_content_parts

LOOPING = (
    "{% for m in messages %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endfor %}"
)
TEMPLATES = {
    "content-written-whole": "{% for m in messages %}{{ m['content'] }}{% endfor %}",
    "content-looped": LOOPING,
    "content-looped-by-attribute": "{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}",
    "content-filtered": "{% for m in messages %}{% for p in m['content'] | selectattr('type', 'equalto', 'text') %}{{ p.text }}{% endfor %}{% endfor %}",
    "content-sliced": "{% for m in messages %}{% for p in m['content'][1:] %}{{ p.text }}{% endfor %}{% endfor %}",
    "string-or-parts": "{% for m in messages %}{% if m['content'] is string %}{{ m['content'] }}{% else %}{% for p in m['content'] %}{{ p['text'] | trim }}{% endfor %}{% endif %}{% endfor %}",
    "messages-sliced-and-set": "{% set loop_messages = messages[1:] %}{% for m in loop_messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endfor %}",
    "messages-set-twice": "{% set a = messages %}{% set b = a | list %}{% for m in b %}{% for p in m.content %}x{% endfor %}{% endfor %}",
    "macro-fed-by-position": "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}{% for m in messages %}{{ show(m['content']) }}{% endfor %}",
    "macro-fed-by-keyword": "{% macro show(c) %}{% for p in c %}{{ p.text }}{% endfor %}{% endmacro %}{% for m in messages %}{{ show(c=m.content) }}{% endfor %}",
    "macro-fed-the-role": "{% macro show(c) %}{% for p in c %}{{ p }}{% endfor %}{% endmacro %}{% for m in messages %}{{ show(m['role']) }}{% endfor %}",
    "content-named-outside-macros": "{% for m in messages %}{% set content = m['content'] %}{% for p in content %}{{ p.text }}{% endfor %}{% endfor %}",
    "content-named-inside-a-macro": "{% macro show(content) %}{% for p in content %}{{ p }}{% endfor %}{% endmacro %}{% for m in messages %}{{ show(m.role) }}{% endfor %}",
    "tools-looped": "{% for t in tools %}{% for p in t.content %}{% endfor %}{% endfor %}{% for m in messages %}{{ m.content }}{% endfor %}",
    "inside-generation": "{% for m in messages %}{% generation %}{% for p in m['content'] %}{{ p.text }}{% endfor %}{% endgeneration %}{% endfor %}",
    "messages-unpacked": "{% for i, m in messages %}{% for p in m.content %}x{% endfor %}{% endfor %}",
    "messages-set-on-a-namespace": "{% set ns = namespace(x=1) %}{% set ns.x = messages %}"
    + LOOPING,
    "content-unpacked": "{% for m in messages %}{% for a, b in m.content %}x{% endfor %}{% endfor %}",
    "unpacked-after-a-loop": "{% for m in messages %}{% for p in m.content %}x{% endfor %}{% for a, b in m.content %}{% endfor %}{% endfor %}",
    "unparsable": "{% for m in messages %}{{ m['content'] }",
}


@pytest.mark.parametrize("name", TEMPLATES)
def test_it_finds_a_loop_over_content_as_vllms_server_does(name):
    from vllm.renderers.hf import _detect_content_format

    template = TEMPLATES[name]
    vllms = _detect_content_format(template, default="string")
    assert ("openai" if reads_content_parts(template) else "string") == vllms


def test_the_demo_template_takes_content_as_a_string_and_a_looping_one_parts():
    from models_registry.demo_model import CHAT_TEMPLATE

    assert not reads_content_parts(CHAT_TEMPLATE)
    assert reads_content_parts(LOOPING)
