"""A deployment's engine settings left out are shaped by what it runs on: the CPU demo's on a
CPU, vLLM's own on a GPU (the machine's detection faked here)."""

from __future__ import annotations

import json

import pytest
from django.core.management import call_command

from models_registry import engine_defaults as defaults
from models_registry.engine_defaults import (
    CPU,
    GIB,
    Accelerator,
    accelerator_for,
    engine_defaults,
)
from models_registry.management.commands import create_deployment
from models_registry.models import Deployment
from models_registry.services import model_version_register

H100 = Accelerator(gpu=True, name="NVIDIA H100 80GB HBM3", memory_bytes=80 * GIB)
A100 = Accelerator(gpu=True, name="NVIDIA A100-SXM4-80GB", memory_bytes=80 * GIB)
L4 = Accelerator(gpu=True, name="NVIDIA L4", memory_bytes=23 * GIB)
B200 = Accelerator(gpu=True, name="NVIDIA B200", memory_bytes=180 * GIB)


def test_a_cpu_keeps_the_demos_settings():
    got = engine_defaults(CPU)
    assert (got.dtype, got.kv_cache_bytes, got.max_num_seqs, got.enforce_eager) == (
        "float32",
        256 << 20,
        64,
        False,
    )


@pytest.mark.parametrize(
    ("accelerator", "sequences"), [(H100, 1024), (B200, 1024), (A100, 256), (L4, 256)]
)
def test_a_gpu_gets_vllms_own_shape(accelerator, sequences):
    got = engine_defaults(accelerator)
    assert got.dtype == "auto"  # the model's own: bfloat16 where the card has it
    assert got.kv_cache_bytes == 0  # sized from the GPU's memory
    assert got.gpu_memory_utilization == 0.9
    assert got.enforce_eager is False  # CUDA graphs on
    assert got.max_num_seqs == sequences


def test_the_accelerator_named_wins_over_the_machine_only_where_the_machine_has_no_gpu():
    assert accelerator_for("cpu", H100) == CPU
    assert accelerator_for("", H100) == H100
    assert accelerator_for("NVIDIA-L4", H100) == H100
    assert accelerator_for("", CPU) == CPU
    named = accelerator_for("NVIDIA-H100-80GB-HBM3", CPU)
    assert named.gpu and named.memory_bytes == 80 * GIB
    assert engine_defaults(named).max_num_seqs == 1024
    unknown = accelerator_for("l4", CPU)  # a GPU whose memory the name does not say
    assert unknown.gpu and engine_defaults(unknown).max_num_seqs == 256


@pytest.fixture
def version(tmp_path, world):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (source / "weights.bin").write_text("weights")
    created, _ = model_version_register(model_name="shaped", source_dir=source)
    return created


@pytest.mark.django_db
def test_create_deployment_on_a_gpu_machine_gets_the_gpu_shape(monkeypatch, version):
    monkeypatch.setattr(create_deployment, "accelerator_detected", lambda: H100)
    call_command("create_deployment", "on-h100", version.public_name)
    deployment = Deployment.objects.get(name="on-h100")
    assert deployment.dtype == "auto"
    assert deployment.kv_cache_bytes == 0
    assert deployment.gpu_memory_utilization == 0.9
    assert deployment.max_num_seqs == 1024
    assert deployment.enforce_eager is False


@pytest.mark.django_db
def test_what_the_operator_sets_wins_and_a_cpu_machine_keeps_todays_values(monkeypatch, version):
    monkeypatch.setattr(create_deployment, "accelerator_detected", lambda: H100)
    call_command(
        "create_deployment", "set", version.public_name, "--dtype", "float16",
        "--kv-cache-mib", "4096", "--max-num-seqs", "32", "--gpu-memory-utilization", "0.8",
    )  # fmt: skip
    deployment = Deployment.objects.get(name="set")
    assert (deployment.dtype, deployment.kv_cache_bytes, deployment.max_num_seqs) == (
        "float16",
        4096 << 20,
        32,
    )
    assert deployment.gpu_memory_utilization == 0.8
    monkeypatch.setattr(create_deployment, "accelerator_detected", lambda: defaults.CPU)
    call_command("create_deployment", "on-cpu", version.public_name)
    deployment = Deployment.objects.get(name="on-cpu")
    assert (deployment.dtype, deployment.kv_cache_bytes, deployment.max_num_seqs) == (
        "float32",
        256 << 20,
        64,
    )
