"""The metric contract of docs/metrics.md, and the series a PromQL expression names.

The deployment assets (alert and recording rules, the Grafana dashboard, the Helm chart's
rules and scaling queries) may only name series the platform documents, with labels those series
carry and label values the documentation lists, or series recorded by platform/prometheus.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
METRICS_DOC = ROOT / "docs" / "metrics.md"
PROMETHEUS_DIR = ROOT / "platform" / "prometheus"
RULE_FILES = (PROMETHEUS_DIR / "recording-rules.yml", PROMETHEUS_DIR / "alert-rules.yml")

HISTOGRAM_SUFFIXES = ("_bucket", "_sum", "_count")
# Labels Prometheus or the Operator attach to every scraped series.
TARGET_LABELS = frozenset({"job", "instance", "namespace", "pod", "container", "endpoint"})
# Series Prometheus itself writes.
BUILTIN_SERIES = frozenset({"up"})
# Labels whose values the contract enumerates: a matcher may only name those values.
ENUM_LABELS = frozenset({"reason", "status", "outcome", "objective", "kind", "priority", "stage"})


@dataclass(frozen=True)
class Series:
    name: str
    type: str
    labels: frozenset[str]
    values: dict[str, frozenset[str]] = field(default_factory=dict)


@dataclass(frozen=True)
class Contract:
    series: dict[str, Series]
    prefixes: tuple[str, ...]  # documented families such as django_http_*
    label_values: dict[str, frozenset[str]]  # enumerations shared by every series

    def lookup(self, name: str) -> tuple[Series | None, str]:
        """Return the documented series a sample name belongs to, and its suffix."""
        if name in self.series:
            return self.series[name], ""
        for suffix in HISTOGRAM_SUFFIXES:
            base = name.removesuffix(suffix)
            if base != name and base in self.series and self.series[base].type == "histogram":
                return self.series[base], suffix
        return None, ""

    def allowed_values(self, series: Series, label: str) -> frozenset[str] | None:
        return series.values.get(label) or self.label_values.get(label)


def _ticks(text: str) -> list[str]:
    return re.findall(r"`([^`]+)`", text)


def contract_load(path: Path = METRICS_DOC) -> Contract:
    """Read the series, their types, labels and enumerated label values from docs/metrics.md."""
    text = path.read_text()
    series: dict[str, Series] = {}
    label_values: dict[str, frozenset[str]] = {}

    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if (
            len(cells) == 4
            and cells[0].startswith("`")
            and cells[1]
            in {
                "counter",
                "gauge",
                "histogram",
            }
        ):
            (name,) = _ticks(cells[0])
            labels = frozenset(_ticks(cells[2]))
            listed = frozenset(_ticks(cells[3]))
            enum = [label for label in labels if label in ENUM_LABELS]
            values = {enum[0]: listed} if len(enum) == 1 and listed else {}
            series[name] = Series(name, cells[1], labels, values)

    # vLLM's own series are listed in prose: "`a`, `b` (histograms), `c` (gauges, …), `d_total`",
    # after the labels they carry (backticked plain words).
    engines = text.split("### Engines", 1)[1].split("\n|", 1)[0]
    engine_labels = frozenset(t for t in _ticks(engines) if re.fullmatch(r"[a-z_]+", t))
    markers = [(m.start(), m.group(1)) for m in re.finditer(r"\((histogram|gauge)s?\b", engines)]
    for match in re.finditer(r"`(vllm:[a-z0-9_:]+)`", engines):
        name = match.group(1)
        kind = next((k for at, k in markers if at > match.start()), None)
        if kind is None and name.endswith("_total"):
            kind = "counter"
        if kind is None:
            raise ValueError(f"docs/metrics.md does not say what type {name} is")
        series[name] = Series(name, kind, engine_labels)

    # `priority` (`interactive`, `batch`) in the introduction; stages in their own table.
    priority = re.search(r"`priority` \(([^)]*)\)", text)
    if priority is None:
        raise ValueError("docs/metrics.md no longer lists the values of `priority`")
    label_values["priority"] = frozenset(_ticks(priority.group(1)))
    stages = text.split("| stage | measured by |", 1)[1].split("\n\n", 1)[0]
    label_values["stage"] = frozenset(
        _ticks(row.split("|")[1])[0] for row in stages.splitlines()[2:] if row.startswith("|")
    )
    prefixes = tuple(name[:-1] for name in _ticks(text) if name.endswith("_*"))
    return Contract(series=series, prefixes=prefixes, label_values=label_values)


# --- PromQL ------------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*'|`[^`]*`)
  | (?P<range>\[[^\]]*\])
  | (?P<braces>\{(?:"(?:[^"\\]|\\.)*"|[^}"])*\})
  | (?P<variable>\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*)
  | (?P<number>\d[\d.eE+]*[smhdwy]?)
  | (?P<ident>[A-Za-z_:][A-Za-z0-9_:]*)
  | (?P<open>\()
  | (?P<other>.)
    """,
    re.VERBOSE | re.DOTALL,
)
_LABEL_LIST_KEYWORDS = frozenset({"by", "without", "on", "ignoring", "group_left", "group_right"})
# Aggregations may take their label list before their argument: `sum by (a) (x)`.
_AGGREGATIONS = frozenset(
    {"sum", "min", "max", "avg", "group", "stddev", "stdvar", "count", "count_values"}
    | {"bottomk", "topk", "quantile", "limitk", "limit_ratio"}
)
_KEYWORDS = _LABEL_LIST_KEYWORDS | _AGGREGATIONS | {"and", "or", "unless", "bool", "offset"}
_MATCHER = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"\s*')


@dataclass(frozen=True)
class Selector:
    name: str
    matchers: tuple[tuple[str, str, str], ...]  # (label, operator, value)


def _matchers(block: str) -> tuple[tuple[str, str, str], ...]:
    inner = block[1:-1].strip().rstrip(",")
    if not inner:
        return ()
    parts = re.findall(r'(?:[^,"]|"(?:[^"\\]|\\.)*")+', inner)
    found = []
    for part in parts:
        match = _MATCHER.fullmatch(part)
        if match is None:
            raise ValueError(f"unreadable label matcher {part!r} in {block!r}")
        found.append((match.group(1), match.group(2), match.group(3)))
    return tuple(found)


def selectors(expr: str) -> list[Selector]:
    """Return every series selector of a PromQL expression (function names are skipped)."""
    tokens = [
        (m.lastgroup, m.group())
        for m in _TOKEN.finditer(expr)
        if m.lastgroup != "other" or not m.group().isspace()
    ]
    found: list[Selector] = []
    i = 0
    while i < len(tokens):
        kind, text = tokens[i]
        following = tokens[i + 1] if i + 1 < len(tokens) else (None, "")
        if kind == "ident" and text in _LABEL_LIST_KEYWORDS and following[0] == "open":
            # by (a, b): skip the label list
            depth, i = 0, i + 1
            while i < len(tokens):
                depth += tokens[i][1] == "("
                depth -= tokens[i][1] == ")"
                i += 1
                if depth == 0:
                    break
            continue
        if kind == "ident" and text not in _KEYWORDS and following[0] != "open":
            matchers: tuple[tuple[str, str, str], ...] = ()
            if following[0] == "braces":
                matchers = _matchers(following[1])
                i += 1
            found.append(Selector(text, matchers))
        elif kind == "braces":
            raise ValueError(f"a selector without a metric name in {expr!r}")
        i += 1
    return found


# --- rules ---------------------------------------------------------------------------------


def rules_load(paths: tuple[Path, ...] = RULE_FILES) -> list[dict]:
    """Return every rule of the given rule files, each with its group's name under `group`."""
    rules = []
    for path in paths:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                rules.append({**rule, "group": group["name"]})
    return rules


def recorded_labels(record: str) -> frozenset[str]:
    """Return the labels a recorded series keeps, from its level (`deployment_priority:…`)."""
    level = record.split(":", 1)[0]
    if level == "roundhouse":
        return frozenset()
    labels = frozenset(level.split("_"))
    return labels


def problems(expr: str, contract: Contract, recorded: set[str]) -> list[str]:
    """Name every series, label or label value an expression uses that the contract lacks."""
    found = []
    for selector in selectors(expr):
        name = selector.name
        if name in recorded:
            labels = recorded_labels(name)
            series = None
        elif name in BUILTIN_SERIES or name.startswith(contract.prefixes or ("\0",)):
            continue
        else:
            series, suffix = contract.lookup(name)
            if series is None:
                found.append(f"{name}: not in docs/metrics.md nor recorded")
                continue
            labels = series.labels | ({"le"} if suffix == "_bucket" else set())
        for label, operator, value in selector.matchers:
            if label not in labels and label not in TARGET_LABELS:
                found.append(f"{name}: no label {label!r}")
                continue
            allowed = contract.allowed_values(series, label) if series else None
            if allowed is None and label in ENUM_LABELS:
                allowed = contract.label_values.get(label)
            if allowed is None or "$" in value:
                continue
            if operator in ("=~", "!~"):
                if not re.fullmatch(r"[\w-]+(\|[\w-]+)*", value):
                    continue
                named = value.split("|")
            else:
                named = [value]
            unknown = [v for v in named if v not in allowed]
            if unknown:
                found.append(f"{name}: {label} values {unknown} are not documented")
    return found
