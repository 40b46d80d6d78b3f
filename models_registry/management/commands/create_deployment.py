from __future__ import annotations

from decimal import Decimal
from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from models_registry.engine_defaults import accelerator_detected, accelerator_for, engine_defaults
from models_registry.models import ModelVersion
from models_registry.selectors import version_pinned
from models_registry.services import deployment_create


class Command(BaseCommand):
    help = "Create a deployment that serves a model version (start its workers with run_worker)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="deployment name, e.g. tiny-chat")
        parser.add_argument("version", help="model@version (or a bare model name for its newest)")
        parser.add_argument(
            "--max-num-seqs",
            type=int,
            default=None,
            help="max concurrent sequences (default: 64 on a CPU; on a GPU 1024 with 70 GiB or "
            "more, else 256)",
        )
        parser.add_argument(
            "--max-queued",
            type=int,
            default=256,
            help="requests that may wait for a free slot (0: only what free slots take at once)",
        )
        parser.add_argument(
            "--max-queued-tokens",
            type=int,
            default=1_000_000,
            help="reserved tokens (prompt + max_tokens) that may wait for a worker",
        )
        parser.add_argument("--max-model-len", type=int, default=None, help="context length cap")
        parser.add_argument(
            "--kv-cache-mib",
            type=int,
            default=None,
            help="KV cache size per worker in MiB (default: 256 on a CPU; on a GPU 0, which sizes "
            "it from the GPU's memory)",
        )
        parser.add_argument(
            "--gpu-memory-utilization",
            type=float,
            default=None,
            help="the share of a GPU's memory the engine may take (default: 0.9)",
        )
        parser.add_argument("--enforce-eager", action="store_true", help="skip graph compilation")
        parser.add_argument(
            "--dtype",
            default=None,
            help="engine dtype (default: float32 on a CPU; auto, the model's own, on a GPU)",
        )
        parser.add_argument(
            "--no-prefix-caching",
            dest="prefix_caching",
            action="store_false",
            help="turn off vLLM's prefix caching (and prefix-aware routing between replicas)",
        )
        parser.add_argument(
            "--max-loras", type=int, default=0, help="LoRA adapters one batch may mix (0: none)"
        )
        parser.add_argument("--max-lora-rank", type=int, default=8, help="largest adapter rank")
        parser.add_argument(
            "--max-batch-size", type=int, default=64, help="encoders: inputs per forward pass"
        )
        parser.add_argument(
            "--latency-slo-ms",
            type=int,
            default=250,
            help="encoders: the latency the dynamic batcher aims for",
        )
        parser.add_argument(
            "--slo-ttft-ms", type=int, default=2000, help="objective: TTFT p95 from admission"
        )
        parser.add_argument("--slo-itl-ms", type=int, default=200, help="objective: ITL p95")
        parser.add_argument(
            "--slo-availability",
            type=Decimal,
            default=Decimal("0.999"),
            help="objective: share of requests that do not fail on the platform's side",
        )
        parser.add_argument(
            "--min-replicas", type=int, default=1, help="autoscaling: warm workers kept at least"
        )
        parser.add_argument(
            "--max-replicas", type=int, default=8, help="autoscaling: workers at most"
        )
        parser.add_argument(
            "--accelerator",
            default="",
            help="what its workers run on (a GPU type such as h100 or l4, a MIG profile, cpu); "
            "another deployment of the same version is another pool of it",
        )
        parser.add_argument(
            "--spot", action="store_true", help="its workers are preemptible: batch work goes first"
        )
        parser.add_argument("--if-missing", action="store_true", help="no error if it exists")

    def handle(self, *args: Any, **options: Any) -> None:
        name, ref = options["name"], options["version"]
        model_name, _, short = ref.partition("@")
        if short:
            version = version_pinned(ref)
        else:
            version = ModelVersion.objects.filter(model__name=model_name).first()
        if version is None:
            raise CommandError(f"no registered version {ref!r}")
        if options["if_missing"] and version.deployments.filter(name=name).exists():
            self.stdout.write(f"deployment {name} exists")
            return
        engine = _engine_settings(options)
        try:
            deployment = deployment_create(
                name=name,
                version=version,
                max_num_seqs=engine["max_num_seqs"],
                max_queued=options["max_queued"],
                max_queued_tokens=options["max_queued_tokens"],
                max_model_len=options["max_model_len"],
                kv_cache_bytes=engine["kv_cache_bytes"],
                gpu_memory_utilization=engine["gpu_memory_utilization"],
                enforce_eager=options["enforce_eager"],
                dtype=engine["dtype"],
                prefix_caching=options["prefix_caching"],
                max_loras=options["max_loras"],
                max_lora_rank=options["max_lora_rank"],
                max_batch_size=options["max_batch_size"],
                latency_slo_ms=options["latency_slo_ms"],
                slo_ttft_p95_ms=options["slo_ttft_ms"],
                slo_itl_p95_ms=options["slo_itl_ms"],
                slo_availability=options["slo_availability"],
                min_replicas=options["min_replicas"],
                max_replicas=options["max_replicas"],
                accelerator=options["accelerator"],
                spot=options["spot"],
            )
        except ValidationError as exc:
            raise CommandError("; ".join(exc.messages)) from exc
        self.stdout.write(
            f"created deployment {deployment} (dtype {deployment.dtype}, "
            f"{deployment.max_num_seqs} sequences, KV cache "
            + (
                f"{deployment.kv_cache_bytes >> 20} MiB)"
                if deployment.kv_cache_bytes
                else f"{deployment.gpu_memory_utilization:.0%} of the GPU's memory)"
            )
        )


def _engine_settings(options: dict[str, Any]) -> dict[str, Any]:
    """The engine settings the options give, each left out shaped by what the deployment runs
    on: the `--accelerator` named, else this machine's (models_registry/engine_defaults.py)."""
    named = {
        "max_num_seqs": options["max_num_seqs"],
        "kv_cache_bytes": None
        if options["kv_cache_mib"] is None
        else options["kv_cache_mib"] << 20,
        "gpu_memory_utilization": options["gpu_memory_utilization"],
        "dtype": options["dtype"],
    }
    if all(value is not None for value in named.values()):
        return named
    accelerator = accelerator_for(options["accelerator"] or "", accelerator_detected())
    defaults = vars(engine_defaults(accelerator))
    return {key: defaults[key] if value is None else value for key, value in named.items()}
