"""Write the synthetic conversations the demo model is trained on, seeded, from word lists.

Each conversation is a list of chat messages (plus, for tool use, a list of tools), rendered
later with the model's own chat template. The kinds teach the formats the platform serves:
short plain answers that end; Hermes tool calls whose arguments follow the schema listed in
the prompt; a short answer after a tool result; JSON objects when asked; and the two shapes a
grammar forces under `tool_choice` ("required": an array of {"name", "parameters"}; a named
tool: the arguments object alone), so that under any of these grammars the likeliest token
writes the next value and closes it rather than padding with whitespace.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

Message = dict[str, Any]


def _listed(text: str) -> tuple[str, ...]:
    """Return the words of text: the lists below read as prose, one entry a word."""
    return tuple(text.split())


WORDS = _listed(
    "apple amber anchor april arrow atlas autumn basil beacon berry birch blue bold breeze "
    "bridge bright brook cable calm candle canyon cedar chalk cherry cinder citrus clay "
    "clever cloud clover coast cobalt comet copper coral cotton crisp crystal daisy dawn delta "
    "desert dune eagle echo ember emerald falcon fern field flint forest fox frost garden "
    "gentle ginger glacier gold granite green harbor hazel hollow honey island ivory jade "
    "juniper kettle lake lantern lemon light lilac linen maple marble meadow mint misty moss "
    "north oak ocean olive orange orchid pearl pebble pepper pine plum prairie quiet rain "
    "raven red reef ridge river robin rose ruby rust sage salt sand scarlet shadow silver "
    "sky slate snow spark spring spruce star stone storm summer sun swift thistle thunder "
    "tide timber topaz valley velvet violet willow winter wolf yellow zephyr"
)
CITIES = _listed(
    "Paris London Berlin Madrid Rome Lisbon Vienna Prague Dublin Oslo Tokyo Lima Cairo "
    "Sydney Toronto Boston Denver Austin Chicago Seattle Nairobi Delhi Seoul Quito"
)
NAMES = _listed("Alice Bob Carol Dave Erin Frank Grace Heidi Ivan Judy Mallory Oscar Peggy Trent")
TOPICS = _listed(
    "weather order invoice ticket flight hotel recipe song book movie meeting task note "
    "payment account package route stock event reminder contact"
)
VERBS = _listed("get find create update list search book cancel send check lookup add fetch")
FIELDS = _listed(
    "name city country title query id count limit amount price unit status category color "
    "date time email phone location label priority size kind topic language code level "
    "score age year month day tag owner user"
)
ENUM_SETS = (
    ("celsius", "fahrenheit"),
    ("low", "medium", "high"),
    ("asc", "desc"),
    ("red", "green", "blue"),
    ("small", "medium", "large"),
    ("open", "closed", "pending"),
    ("daily", "weekly", "monthly"),
    ("yes", "no"),
)
GREETINGS = ("Hi", "Hello", "Hey", "Good morning", "Good evening")
QUESTIONS = (
    ("What is the capital of France?", "Paris."),
    ("What is the capital of Japan?", "Tokyo."),
    ("What is 2 + 2?", "4."),
    ("What is 3 times 5?", "15."),
    ("What color is the sky?", "Blue."),
    ("Say hello.", "Hello!"),
    ("How are you?", "I am well, thank you."),
    ("Who are you?", "I am a small demo assistant."),
    ("Tell me a joke.", "Why did the bit flip? It was tired of being zero."),
    ("What day comes after Monday?", "Tuesday."),
    ("Count to five.", "1, 2, 3, 4, 5."),
    ("Is water wet?", "Yes."),
    ("Name a fruit.", "An apple."),
    ("Thanks!", "You are welcome."),
    (
        "Write a haiku.",
        "Quiet morning rain, the old stone path remembers, green moss drinks it in.",
    ),
)
SYSTEM_PROMPTS = (
    "You are a helpful assistant.",
    "You are a concise assistant.",
    "Answer briefly.",
    "You are a friendly bot.",
)
JSON_ASKS = (
    "Reply with a JSON object.",
    "Answer in JSON.",
    "Return JSON only.",
    "Respond with a JSON object and nothing else.",
    "Output valid JSON.",
    "Give me the answer as JSON.",
)


@dataclass(frozen=True)
class Conversation:
    """Messages and tools for one training example; the last message is the one learned."""

    messages: list[Message]
    tools: list[dict[str, Any]] | None = None


def conversations_generate(*, count: int, seed: int) -> list[Conversation]:
    """Return count conversations drawn from seed, every kind mixed in fixed proportions."""
    rng = random.Random(seed)  # nosec B311: synthetic training data, seeded to be repeatable
    kinds = (
        (_plain, 19),
        (_hermes_call, 19),
        (_after_tool_result, 11),
        (_json_answer, 22),
        (_required_array, 19),
        (_named_arguments, 10),
    )
    makers = [maker for maker, weight in kinds for _ in range(weight)]
    return [rng.choice(makers)(rng) for _ in range(count)]


def _words(rng: random.Random, low: int = 1, high: int = 3) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(rng.randint(low, high)))


def _property(rng: random.Random, depth: int) -> dict[str, Any]:
    """Return a random JSON schema for one property."""
    roll = rng.random()
    if roll < 0.35:
        return {"type": "string", "description": _words(rng, 2, 4)}
    if roll < 0.5:
        return {"type": "string", "enum": list(rng.choice(ENUM_SETS))}
    if roll < 0.68:
        return {"type": "integer"}
    if roll < 0.76:
        return {"type": "number"}
    if roll < 0.84:
        return {"type": "boolean"}
    if roll < 0.9:
        return {"type": "array", "items": {"type": "string"}}
    if depth == 0:
        return _object_schema(rng, depth=1, low=1, high=3)
    return {"type": "string"}


def _object_schema(rng: random.Random, *, depth: int, low: int, high: int) -> dict[str, Any]:
    names = rng.sample(FIELDS, rng.randint(low, high))
    properties = {name: _property(rng, depth) for name in names}
    required = [name for name in names if rng.random() < 0.8] or names[:1]
    return {"type": "object", "properties": properties, "required": required}


def _value(rng: random.Random, name: str, schema: dict[str, Any]) -> Any:
    """Return a short value that validates against schema."""
    kind = schema.get("type")
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if kind == "integer":
        return rng.choice((rng.randint(0, 9), rng.randint(10, 99), rng.randint(100, 2026)))
    if kind == "number":
        return round(rng.uniform(0, 500), rng.randint(0, 2))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return [_string(rng, name) for _ in range(rng.randint(1, 3))]
    if kind == "object":
        return _arguments(rng, schema)
    return _string(rng, name)


def _string(rng: random.Random, name: str) -> str:
    if name in ("city", "location"):
        return rng.choice(CITIES)
    if name in ("name", "owner", "user"):
        return rng.choice(NAMES)
    if name == "email":
        return f"{rng.choice(NAMES).lower()}@example.com"
    if name in ("date",):
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    return _words(rng, 1, 2)


def _arguments(rng: random.Random, schema: dict[str, Any]) -> dict[str, Any]:
    properties = schema.get("properties", {})
    required = set(schema.get("required", ()))
    return {
        name: _value(rng, name, sub)
        for name, sub in properties.items()
        if name in required or rng.random() < 0.5
    }


def _tool(rng: random.Random) -> dict[str, Any]:
    name = f"{rng.choice(VERBS)}_{rng.choice(TOPICS)}"
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": f"{name.replace('_', ' ').capitalize()} by {_words(rng, 1, 2)}.",
            "parameters": _object_schema(rng, depth=0, low=1, high=5),
        },
    }


def _tools(rng: random.Random) -> list[dict[str, Any]]:
    tools: dict[str, dict[str, Any]] = {}
    for _ in range(rng.choice((1, 1, 2, 2, 3))):
        tool = _tool(rng)
        tools[tool["function"]["name"]] = tool
    return list(tools.values())


def _opening(rng: random.Random) -> list[Message]:
    if rng.random() < 0.4:
        return [{"role": "system", "content": rng.choice(SYSTEM_PROMPTS)}]
    return []


def _request(rng: random.Random, tool: dict[str, Any], arguments: dict[str, Any]) -> str:
    """Return a user turn asking for what the call does, naming some of its arguments."""
    words = tool["function"]["name"].replace("_", " ")
    shown = ", ".join(f"{key} {value}" for key, value in arguments.items() if rng.random() < 0.7)
    ending = f" with {shown}" if shown else ""
    template = rng.choice(("Please {}{}.", "Can you {}{}?", "{}{}", "I need to {}{}."))
    return template.format(words, ending)


def _calls(
    rng: random.Random, tools: list[dict[str, Any]], *, two: float = 0.08
) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """Return one call, or two with probability two, each with arguments for its schema."""
    count = 2 if rng.random() < two else 1
    chosen = [rng.choice(tools) for _ in range(count)]
    return [(tool, _arguments(rng, tool["function"]["parameters"])) for tool in chosen]


def _tool_call(tool: dict[str, Any], arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {"name": tool["function"]["name"], "arguments": json.dumps(arguments)},
    }


def _plain(rng: random.Random) -> Conversation:
    messages = _opening(rng)
    if rng.random() < 0.25:
        question, answer = _plain_topic(rng)
    elif rng.random() < 0.6:
        question, answer = rng.choice(QUESTIONS)
    elif rng.random() < 0.5:
        question, answer = f"{rng.choice(GREETINGS)}!", f"{rng.choice(GREETINGS)}! How can I help?"
    else:
        words = _words(rng, 1, 4)
        question = rng.choice(("Repeat: {}", "Say {}", "Echo {}", "{}")).format(words)
        answer = words.capitalize() + "."
    if rng.random() < 0.2:
        messages += [
            {"role": "user", "content": rng.choice(QUESTIONS)[0]},
            {"role": "assistant", "content": rng.choice(QUESTIONS)[1]},
        ]
    messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return Conversation(messages)


def _plain_topic(rng: random.Random) -> tuple[str, str]:
    """Return a question _json_topic also asks, and a sentence that answers it without JSON."""
    name, city, word = rng.choice(NAMES), rng.choice(CITIES), rng.choice(WORDS)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    return rng.choice(
        (
            (f"Describe a person called {name}.", f"{name} is a kind person."),
            (f"Who is {name}?", f"{name} lives in {city}."),
            (f"Describe {city}.", f"{city} is a city."),
            (f"Tell me about {city}.", f"{city} is a fine place to visit."),
            (f"Write one sentence about {city}.", f"{city} is lovely in the {word}."),
            (f"What is {a} plus {b}?", f"{a + b}."),
            (f"Describe a {word}.", f"A {word} is {rng.choice(ENUM_SETS[3])}."),
            (f"Tell me something about {word}.", f"The {word} is quiet."),
            (f"Give me a word that rhymes with {word}.", rng.choice(WORDS).capitalize() + "."),
        )
    )


def _hermes_call(rng: random.Random) -> Conversation:
    tools = _tools(rng)
    calls = _calls(rng, tools)
    messages = [*_opening(rng), {"role": "user", "content": _request(rng, *calls[0])}]
    messages.append(
        {"role": "assistant", "content": "", "tool_calls": [_tool_call(*call) for call in calls]}
    )
    return Conversation(messages, tools)


def _after_tool_result(rng: random.Random) -> Conversation:
    tools = _tools(rng)
    calls = _calls(rng, tools)
    results = [{"result": _words(rng, 1, 3), "ok": True} for _ in calls]
    messages = [
        *_opening(rng),
        {"role": "user", "content": _request(rng, *calls[0])},
        {"role": "assistant", "content": "", "tool_calls": [_tool_call(*call) for call in calls]},
    ]
    messages += [{"role": "tool", "content": json.dumps(result)} for result in results]
    answer = rng.choice(("Done: {}.", "The result is {}.", "Here it is: {}.", "{}."))
    messages.append({"role": "assistant", "content": answer.format(results[0]["result"])})
    return Conversation(messages, tools)


def _json_answer(rng: random.Random) -> Conversation:
    ask = rng.choice(JSON_ASKS)
    roll = rng.random()
    if roll < 0.5:
        question, value = _json_topic(rng)
        # The ask in the user's turn, or alone in the system prompt.
        if rng.random() < 0.7:
            content, messages = f"{question} {ask}", _opening(rng)
        else:
            content, messages = question, [{"role": "system", "content": ask}]
    else:
        schema = _object_schema(rng, depth=0, low=1, high=5)
        value = _arguments(rng, schema)
        messages = _opening(rng)
        if roll < 0.6:
            content = f"{ask} Fields: {', '.join(value)}." if value else ask
        elif roll < 0.72:
            content = f"{ask} Schema: {json.dumps(schema)}"
        else:
            # A json_schema grammar forces fields the prompt never names: after any value the
            # next key or the closing brace must stay likelier than whitespace.
            content = f"{_json_topic(rng)[0]} {ask}"
    messages += [
        {"role": "user", "content": content},
        {"role": "assistant", "content": json.dumps(value)},
    ]
    return Conversation(messages)


def _json_topic(rng: random.Random) -> tuple[str, dict[str, Any]]:
    """Return a question and the small object that answers it."""
    name, city, word = rng.choice(NAMES), rng.choice(CITIES), rng.choice(WORDS)
    a, b = rng.randint(0, 99), rng.randint(0, 99)
    question, answer = rng.choice(QUESTIONS)
    return rng.choice(
        (
            (f"Describe a person called {name}.", {"name": name, "age": rng.randint(18, 90)}),
            (f"Who is {name}?", {"name": name, "city": city}),
            (f"Describe {city}.", {"city": city, "population": rng.randint(1, 900) * 1000}),
            (f"Tell me about {city}.", {"name": city, "sunny": rng.random() < 0.5}),
            (f"What is {a} plus {b}?", {"answer": a + b}),
            (f"Add {a} and {b}.", {"sum": a + b}),
            (f"Describe a {word}.", {"name": word, "color": rng.choice(ENUM_SETS[3])}),
            (f"Give me a {word}.", {"item": word}),
            (f"List two words like {word}.", {"words": [word, rng.choice(WORDS)]}),
            (question, {"answer": answer}),
        )
    )


def _required_array(rng: random.Random) -> Conversation:
    # The grammar lets the array go on after its first call: where one call answers, the
    # model must close it, so a second call is rare here.
    tools = _tools(rng)
    calls = _calls(rng, tools, two=0.02)
    array = [{"name": tool["function"]["name"], "parameters": args} for tool, args in calls]
    messages = [
        *_opening(rng),
        {"role": "user", "content": _request(rng, *calls[0])},
        {"role": "assistant", "content": json.dumps(array)},
    ]
    return Conversation(messages, tools)


def _named_arguments(rng: random.Random) -> Conversation:
    tools = _tools(rng)
    tool, arguments = _calls(rng, tools)[0]
    messages = [
        *_opening(rng),
        {"role": "user", "content": _request(rng, tool, arguments)},
        {"role": "assistant", "content": json.dumps(arguments)},
    ]
    return Conversation(messages, tools)
