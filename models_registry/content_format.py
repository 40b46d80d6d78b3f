"""How a chat template reads a message's content: as one string, or as a list of parts.

Most templates write `message['content']` as a string. Some (Llama 4's, Gemma 3's and many
multimodal models') loop over it, `{% for part in message['content'] %}`, and write each
part. vLLM's server finds out which by reading the template's syntax tree (its "auto"
content format) and hands such a template every message's content as a list of parts
(`{"type": "text", "text": ...}`), where it hands the others one joined string. What a
template writes differs between the two (a part it trims, say, or an empty part it skips), so
the platform reads templates the same way to write the prompt vLLM's server would.

The reading follows names through the template: the names that stand for the conversation
(`messages` and what is set from it), the loop variables over those (the messages), then a
loop over a message's `content`, over a macro's parameter that a call passes a message's
content to, or over a name `content` outside any macro. A filter, a test or a slice around a
name is looked through (`messages[1:]`, `message['content'] | selectattr(...)`).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator

from jinja2 import nodes


class _Unreadable(Exception):
    """A loop or assignment the reading cannot follow (a tuple or namespace target)."""


@functools.lru_cache(maxsize=64)
def reads_content_parts(template: str) -> bool:
    """Return whether a chat template loops over a message's content (it takes parts).

    A template that cannot be parsed, or whose loops over the conversation the reading cannot
    follow, takes a string, as vLLM's server decides for it.
    """
    # Parsed in the environment transformers renders it in (its `generation` tag included).
    from transformers.utils.chat_template_utils import _compile_jinja_template

    try:
        tree = _compile_jinja_template(template).environment.parse(template)
    except Exception:
        return False
    try:
        return next(_content_loops(tree), None) is not None
    except _Unreadable:
        return False


def _wrapped(node: nodes.Node) -> nodes.Node | None:
    """The expression a filter, a test or a slice is applied to (None: it is none of those)."""
    if isinstance(node, nodes.Filter | nodes.Test):
        return node.node
    if isinstance(node, nodes.Getitem) and isinstance(node.arg, nodes.Slice):
        return node.node
    return None


def _inner(node: nodes.Node) -> nodes.Node:
    """The expression under any filters, tests and slices applied to it."""
    while (wrapped := _wrapped(node)) is not None:
        node = wrapped
    return node


def _is_name(node: nodes.Node, name: str) -> bool:
    return isinstance(node, nodes.Name) and node.ctx == "load" and node.name == name


def _reads(node: nodes.Node, name: str) -> bool:
    """Whether an expression is the variable `name` (through filters, tests and slices)."""
    return _is_name(_inner(node), name)


def _reads_key(node: nodes.Node, name: str, key: str) -> bool:
    """Whether an expression is `name[key]` or `name.key` (through filters, tests, slices)."""
    node = _inner(node)
    if isinstance(node, nodes.Getitem):
        return (
            _is_name(node.node, name)
            and isinstance(node.arg, nodes.Const)
            and node.arg.value == key
        )
    if isinstance(node, nodes.Getattr):
        return _is_name(node.node, name) and node.attr == key
    return False


def _target(node: nodes.Node) -> str:
    if not isinstance(node, nodes.Name):
        raise _Unreadable
    return node.name


def _conversation_names(tree: nodes.Template) -> set[str]:
    """`messages` and every name set from it, or from a name set from it, and so on."""
    found = {"messages"}
    pending = ["messages"]
    while pending:
        name = pending.pop()
        for assign in tree.find_all(nodes.Assign):
            if _reads(assign.node, name):
                target = _target(assign.target)
                if target not in found:
                    found.add(target)
                    pending.append(target)
    return found


def _message_names(tree: nodes.Template) -> set[str]:
    """The loop variables of loops over the conversation: the names a message goes by."""
    conversation = _conversation_names(tree)
    return {
        _target(loop.target)
        for loop in tree.find_all(nodes.For)
        if any(_reads(loop.iter, name) for name in conversation)
    }


def _macro_content_params(
    tree: nodes.Template, messages: set[str]
) -> tuple[dict[int, set[str]], set[int]]:
    """For each loop in a macro, the macro's parameters that some call passes a message's
    content to (keyed by the loop's id); and the ids of every loop inside a macro."""
    params_of_loop: dict[int, set[str]] = {}
    in_macros: set[int] = set()

    def is_content(node: nodes.Node) -> bool:
        return any(_reads_key(node, name, "content") for name in messages)

    for macro in tree.find_all(nodes.Macro):
        params = [arg.name for arg in macro.args]
        fed: set[str] = set()
        for call in tree.find_all(nodes.Call):
            if not _is_name(call.node, macro.name):
                continue
            fed |= {params[i] for i, arg in enumerate(call.args[: len(params)]) if is_content(arg)}
            fed |= {kw.key for kw in call.kwargs if kw.key in params and is_content(kw.value)}
        for loop in macro.find_all(nodes.For):
            in_macros.add(id(loop))
            if fed:
                params_of_loop[id(loop)] = fed
    return params_of_loop, in_macros


def _content_loops(tree: nodes.Template) -> Iterator[nodes.For]:
    """The template's loops over a message's content, in the template's order."""
    messages = _message_names(tree)
    params_of_loop, in_macros = _macro_content_params(tree, messages)
    for loop in tree.find_all(nodes.For):
        iterated = loop.iter
        over_content = (
            any(_reads_key(iterated, name, "content") for name in messages)
            or (
                isinstance(iterated, nodes.Name)
                and iterated.name in params_of_loop.get(id(loop), ())
            )
            or (id(loop) not in in_macros and _is_name(iterated, "content"))
        )
        if over_content:
            _target(loop.target)
            yield loop
