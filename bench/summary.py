"""One table of every benchmark's headline figures, with latency CDFs and throughput plots.

Reads the raw results the benchmarks save in docs/bench-data/<name>.json and writes the first
section of docs/benchmarks.md: one row per headline measure, with its value, the issue's
target where it sets one, met or missed, the date measured and a link to the benchmark's own
section. Draws docs/img/latency_cdf.png and docs/img/throughput.png from the same files, and embeds
both. Runs no benchmark: run those first.

    .venv/bin/python bench/summary.py [--docs docs]

A results file without a reader of its own here gives one row per scalar of its `summary`
(checked against `targets` by the same keys), or the rows of its `headline` list
(`measure`, `value`, optionally `target`); a file with neither is skipped with a note.
"""

from __future__ import annotations

import argparse
import json
import math
import operator
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.common import plot_path, progress, section_write_first  # noqa: E402

# Benchmarks listed first, in this order; other results files follow by name.
ORDER = (
    "stream_overhead",
    "stream_overhead_gpu",
    "structured",
    "structured_gpu",
    "admission",
    "embeddings",
    "gateway_overhead",
    "soak",
)
BOUNDS = {
    "≤": operator.le,
    "<=": operator.le,
    "<": operator.lt,
    "≥": operator.ge,
    ">=": operator.ge,
    ">": operator.gt,
}


@dataclass(frozen=True)
class Row:
    measure: str
    value: str
    target: str = ""
    met: bool | None = None


Results = dict[str, Any]


def results_read(docs: Path) -> dict[str, Results]:
    """Return every results file under docs/bench-data by benchmark name, in table order.

    A file that is not a JSON object is skipped with a note.
    """
    found: dict[str, Results] = {}
    for path in sorted((docs / "bench-data").glob("*.json")):
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            progress(f"skipping {path.name}: {exc}")
            continue
        if isinstance(data, dict):
            found[path.stem] = data
        else:
            progress(f"skipping {path.name}: not a JSON object")
    first = [name for name in ORDER if name in found]
    return {name: found[name] for name in first + sorted(set(found) - set(first))}


def _met(value: Any, target: str) -> bool | None:
    """Return whether value meets a target such as "≤ 1.5"; None when either is unreadable."""
    match = re.fullmatch(r"\s*(≤|<=|<|≥|>=|>)\s*([-+]?\d+(?:\.\d+)?).*", target)
    if match is None or isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if math.isnan(value):
        return None
    return bool(BOUNDS[match[1]](value, float(match[2])))


def _judged(measure: str, value: Any, text: str, target: Any, unit: str = "") -> Row:
    if not target:
        return Row(measure, text)
    return Row(measure, text, f"{target} {unit}".strip(), _met(value, str(target)))


def _many(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _number(value: float | None, digits: int = 2) -> str:
    if value is None or math.isnan(value):
        return "n/a"
    return f"{value:,.{digits}f}"


# --- one reader per benchmark --------------------------------------------------------------


def _stream_rows(data: Results) -> list[Row]:
    levels = data["summary"]["levels"]
    gpu = data.get("settings", {}).get("gpu")
    # A GPU run's rows say so: the CPU rows above them are of another machine.
    streaming = f"Streaming on one {gpu}" if gpu else "Streaming"
    targets = data.get("targets", {})
    rows = [
        _judged(
            f"{streaming} tok/s, Roundhouse ÷ vLLM, {_many(lvl['concurrency'], 'stream')}",
            lvl["throughput_ratio"],
            _number(lvl["throughput_ratio"]),
            targets.get("throughput_ratio"),
        )
        for lvl in levels
    ]
    for lvl in levels:
        delta = lvl["ttft_p50_delta_ms"]
        rows.append(
            _judged(
                f"{streaming} TTFT p50, Roundhouse − vLLM, {_many(lvl['concurrency'], 'stream')}",
                delta,
                "n/a" if delta is None else f"{delta:+.1f} ms",
                # The added median is a target at one stream, where nothing else adds to it.
                targets.get("ttft_p50_delta_ms") if lvl["concurrency"] == 1 else None,
                "ms",
            )
        )
    for key, name in (("ttft_p99_ratio", "TTFT p99"), ("itl_p99_ratio", "ITL p99")):
        for lvl in levels:
            if key not in lvl:
                continue  # results from before the tail was measured
            rows.append(
                _judged(
                    f"{streaming} {name}, Roundhouse ÷ vLLM, {_many(lvl['concurrency'], 'stream')}",
                    lvl[key],
                    _number(lvl[key]),
                    targets.get(key),
                )
            )
    return rows


def _admission_rows(data: Results) -> list[Row]:
    summary, targets = data["summary"], data.get("targets", {})
    roundhouse = summary.get("neighbour_p99_ratio_roundhouse")
    vllm = summary.get("neighbour_p99_ratio_vllm")
    factor = data.get("settings", {}).get("overload_factor", 10)
    overload = f"Overload at {factor:g}× capacity"
    return [
        _judged(
            "Noisy neighbour: tenant B's TTFT p99 under A's flood ÷ alone, Roundhouse",
            roundhouse,
            f"{_number(roundhouse)} (vLLM: {_number(vllm)})",
            targets.get("neighbour_p99_ratio_roundhouse"),
        ),
        _judged(
            f"{overload}: goodput ÷ capacity",
            summary["goodput"],
            _number(summary["goodput"]),
            targets.get("goodput"),
        ),
        _judged(
            f"{overload}: rejection latency p99",
            summary["rejection_p99_ms"],
            f"{_number(summary['rejection_p99_ms'], 1)} ms",
            targets.get("rejection_p99_ms"),
            "ms",
        ),
        _judged(
            f"{overload}: admitted TTFT p99 ÷ TTFT p99 at capacity",
            summary["admitted_ttft_ratio"],
            _number(summary["admitted_ttft_ratio"]),
            targets.get("admitted_ttft_ratio"),
        ),
    ]


def _embedding_rows(data: Results) -> list[Row]:
    targets = data.get("targets", {})
    return [
        _judged(
            "Embeddings inputs/s through HTTP, batcher ÷ one at a time, "
            f"{_many(lvl['concurrency'], 'client')}",
            lvl["speedup"],
            f"{_number(lvl['speedup'], 1)}×",
            targets.get("speedup"),
        )
        for lvl in data["summary"]["http"]
    ]


def _generic_rows(name: str, data: Results) -> list[Row]:
    """Read a results file by convention: a `headline` list, or the scalars of `summary`."""
    label = name.replace("_", " ").capitalize()
    headline = data.get("headline")
    if isinstance(headline, list):
        return [
            _judged(str(h["measure"]), h["value"], _scalar(h["value"]) or "", h.get("target"))
            for h in headline
            if isinstance(h, dict) and "measure" in h and "value" in h
        ]
    summary, targets = data.get("summary"), data.get("targets")
    if not isinstance(summary, dict):
        progress(f"{name}.json: no `headline` or `summary`, left out of the table")
        return []
    if not isinstance(targets, dict):
        targets = {}
    rows = []
    for key, value in summary.items():
        text = _scalar(value)
        if text is not None:  # lists and tables belong in the benchmark's own section
            measure = f"{label}: {key.replace('_', ' ')}"
            rows.append(_judged(measure, value, text, targets.get(key)))
    return rows


def _scalar(value: Any) -> str | None:
    """Return a number, string or flag as the table shows it; None for anything else."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        return _number(value, 0 if abs(value) >= 100 else 2)
    if isinstance(value, str):
        return value
    return None


READERS: dict[str, Callable[[Results], list[Row]]] = {
    "stream_overhead": _stream_rows,
    "stream_overhead_gpu": _stream_rows,
    "admission": _admission_rows,
    "embeddings": _embedding_rows,
}


def _rows(name: str, data: Results) -> list[Row]:
    reader = READERS.get(name)
    try:
        return reader(data) if reader else _generic_rows(name, data)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        progress(f"skipping {name}.json: unexpected layout ({exc!r})")
        return []


# --- the table -----------------------------------------------------------------------------


def _headings(markdown: str) -> dict[str, str]:
    """Return each benchmark section's heading by its name."""
    found = {}
    for name, body in re.findall(r"<!-- bench:(\w+) -->(.*?)<!-- /bench:\1 -->", markdown, re.S):
        heading = re.search(r"^## (.+)$", body, re.M)
        if heading:
            found[name] = heading[1].strip()
    return found


def _link(section: str, headings: dict[str, str]) -> str:
    heading = headings.get(section)
    if heading is None:
        return section
    # The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to hyphens.
    anchor = re.sub(r"[^\w\- ]", "", heading.lower()).replace(" ", "-")
    return f"[{heading.split(':')[0]}](#{anchor})"


def summary_table(results: dict[str, Results], headings: dict[str, str]) -> str:
    """Return the markdown table of every results file's headline rows."""
    lines = [
        "| measure | value | target | met? | measured | details |",
        "| --- | ---: | ---: | --- | --- | --- |",
    ]
    for name, data in results.items():
        rows = _rows(name, data)
        link = _link(str(data.get("section", name)), headings)
        measured = str(data.get("measured", ""))
        for row in rows:
            met = {True: "met", False: "**missed**", None: ""}[row.met]
            cells = [row.measure, row.value, row.target, met, measured, link]
            lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


# --- the figures ---------------------------------------------------------------------------


def _cdf(ax: Any, values: list[float | None], **style: Any) -> None:
    """Step plot of the fraction of samples at or below each value (positive samples only)."""
    ordered = sorted(v for v in values if v is not None and v > 0)
    if ordered:
        ax.step(
            ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], where="post", **style
        )


def _panel(
    ax: Any, title: str, data: Results | None, name: str, draw: Callable[[Any, Results], None]
) -> None:
    ax.set_title(title, fontsize=10)
    if data is not None:
        try:
            draw(ax, data)
            return
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            progress(f"{name}.json: cannot plot {title!r} ({exc!r})")
            ax.clear()
            ax.set_title(title, fontsize=10)
    ax.text(0.5, 0.5, f"no {name} results", ha="center", va="center", transform=ax.transAxes)
    ax.set_axis_off()


def _latency_axes(ax: Any) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_xscale("log")
    low, high = ax.get_xlim()
    # Plain numbers at 1, 2 and 5 per decade read better than powers of ten; decades alone
    # over a wide span.
    subs = (1.0, 2.0, 5.0) if math.log10(high / low) <= 3 else (1.0,)
    ax.xaxis.set_major_locator(LogLocator(base=10, subs=subs))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set(xlabel="ms (log)", ylabel="fraction of requests", ylim=(0, 1.02))
    ax.axhline(0.99, color="grey", linewidth=0.6, linestyle=":")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7, loc="best")


def _stream_cdf(ax: Any, data: Results) -> None:
    for i, (vllm, roundhouse) in enumerate(
        zip(data["median"]["vllm"], data["median"]["roundhouse"], strict=True)
    ):
        c = vllm["concurrency"]
        streams = _many(c, "stream")
        _cdf(ax, vllm["ttfts_ms"], color=f"C{i}", linestyle="--", label=f"vLLM, {streams}")
        _cdf(ax, roundhouse["ttfts_ms"], color=f"C{i}", label=f"Roundhouse, {streams}")
    _latency_axes(ax)


def _neighbour_cdf(ax: Any, data: Results) -> None:
    for i, row in enumerate(data["neighbour"]):
        name = {"vllm": "vLLM", "roundhouse": "Roundhouse"}.get(row["target"], row["target"])
        _cdf(ax, row["alone_ttft_ms"], color=f"C{i}", linestyle="--", label=f"{name}, B alone")
        _cdf(ax, row["flooded_ttft_ms"], color=f"C{i}", label=f"{name}, B under A's flood")
    _latency_axes(ax)


def _overload_cdf(ax: Any, data: Results) -> None:
    overload, full = data["overload"], data["settings"]["overload_tokens"]
    requests = overload["requests"]
    columns = ("status", "ttft_ms", "latency_ms", "tokens")
    admitted, rejected = [], []
    for status, ttft, latency, tokens in zip(*(requests[c] for c in columns), strict=True):
        if status == 200 and tokens == full:
            admitted.append(ttft)
        elif status in (429, 503):
            rejected.append(latency)
    _cdf(ax, overload["capacity_ttft_ms"], color="C0", linestyle="--", label="TTFT at capacity")
    _cdf(ax, admitted, color="C0", label="admitted: TTFT")
    _cdf(ax, rejected, color="C3", label="rejected: time to the refusal")
    _latency_axes(ax)


def _embedding_cdf(ax: Any, data: Results) -> None:
    http = data["runs"]["http"]
    for i, (batched, single) in enumerate(zip(http["batched"], http["single"], strict=True)):
        c = batched["concurrency"]
        clients = _many(c, "client")
        _cdf(ax, batched["latencies_ms"], color=f"C{i}", label=f"batcher, {clients}")
        _cdf(
            ax,
            single["latencies_ms"],
            color=f"C{i}",
            linestyle="--",
            label=f"one at a time, {clients}",
        )
    _latency_axes(ax)


def _concurrency_axes(ax: Any, levels: list[int], xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(levels, [str(c) for c in levels])
    ax.set(xlabel=xlabel, ylabel=ylabel, ylim=(0, None))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)


def _stream_throughput(ax: Any, data: Results) -> None:
    levels = data["summary"]["levels"]
    xs = [lvl["concurrency"] for lvl in levels]
    ax.plot(xs, [lvl["vllm_tokens_per_s"] for lvl in levels], "o--", label="vLLM OpenAI server")
    ax.plot(xs, [lvl["roundhouse_tokens_per_s"] for lvl in levels], "s-", label="Roundhouse")
    _concurrency_axes(ax, xs, "concurrent streams", "output tokens/s")


def _embedding_throughput(ax: Any, data: Results) -> None:
    summary = data["summary"]
    xs = [lvl["concurrency"] for lvl in summary["http"]]
    for path, style, where in (("http", "-", "HTTP"), ("queue", ":", "queue")):
        if path not in summary:
            continue
        rows = summary[path]
        ax.plot(
            xs,
            [r["batched_inputs_per_s"] for r in rows],
            f"o{style}",
            color="C0",
            label=f"dynamic batcher, {where}",
        )
        ax.plot(
            xs,
            [r["single_inputs_per_s"] for r in rows],
            f"s{style}",
            color="C1",
            label=f"one at a time, {where}",
        )
    _concurrency_axes(ax, xs, "concurrent clients", "inputs/s")


def figures_draw(results: dict[str, Results], docs: Path) -> None:
    """Write docs/img/latency_cdf.png and docs/img/throughput.png."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stream, admission = results.get("stream_overhead"), results.get("admission")
    embeddings = results.get("embeddings")
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    _panel(
        axes[0][0],
        "Streaming: time to first token (median round)",
        stream,
        "stream_overhead",
        _stream_cdf,
    )
    _panel(
        axes[0][1],
        "Noisy neighbour: tenant B's time to first token",
        admission,
        "admission",
        _neighbour_cdf,
    )
    factor = (admission or {}).get("settings", {}).get("overload_factor", 10)
    _panel(
        axes[1][0],
        f"Overload at {factor:g}× capacity: admitted TTFT and refusals",
        admission,
        "admission",
        _overload_cdf,
    )
    _panel(
        axes[1][1],
        "Embeddings: request latency through HTTP",
        embeddings,
        "embeddings",
        _embedding_cdf,
    )
    fig.suptitle("Latency CDFs (dotted line: p99)")
    fig.tight_layout()
    fig.savefig(plot_path(docs, "latency_cdf"), dpi=110)
    plt.close(fig)

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    _panel(left, "Streaming throughput", stream, "stream_overhead", _stream_throughput)
    _panel(right, "Embeddings throughput", embeddings, "embeddings", _embedding_throughput)
    fig.suptitle("Throughput vs concurrency")
    fig.tight_layout()
    fig.savefig(plot_path(docs, "throughput"), dpi=110)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--docs", type=Path, default=ROOT / "docs", help="where results are")
    args = parser.parse_args()
    args.docs.mkdir(parents=True, exist_ok=True)
    results = results_read(args.docs)
    if not results:
        progress(f"no results in {args.docs / 'bench-data'}: run the benchmarks first")
    markdown = args.docs / "benchmarks.md"
    headings = _headings(markdown.read_text() if markdown.exists() else "")
    table = summary_table(results, headings)
    print("\n" + table)
    figures_draw(results, args.docs)
    section_write_first(
        args.docs,
        "summary",
        "## Summary\n\n"
        "Every benchmark's headline figures from its last full run, built by `bench/summary.py` "
        "from the raw results each benchmark saves in `docs/bench-data/`. The target is what "
        "the issue asks, where it sets a bound; details link to each benchmark's section, with "
        "its method and the machine it ran on.\n\n"
        + table
        + "\n\nLatency CDFs: streaming TTFT per concurrency level (the median round of each); "
        "tenant B's TTFT alone and under tenant A's flood; admitted requests' TTFT and the "
        "time to a refusal under overload, against the TTFT at capacity; embedding request "
        "latency with the dynamic batcher and one at a time.\n\n"
        "![latency CDFs](img/latency_cdf.png)\n\n"
        "![throughput vs concurrency](img/throughput.png)\n",
    )
    progress(
        f"wrote {markdown}, {args.docs / 'img' / 'latency_cdf.png'} and "
        f"{args.docs / 'img' / 'throughput.png'}"
    )


if __name__ == "__main__":
    main()
