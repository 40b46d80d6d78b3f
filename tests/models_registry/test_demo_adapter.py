"""The demo LoRA adapter: deterministic, so it content-addresses to one version."""

from __future__ import annotations

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from models_registry.services import model_version_register

pytestmark = pytest.mark.django_db


def test_the_same_seed_builds_the_same_adapter_version(tmp_path, world, demo_model_dir):
    for name in ("a", "b"):
        call_command(
            "build_demo_adapter", "--out", str(tmp_path / name), "--base", str(demo_model_dir)
        )
    first, created = model_version_register(
        model_name="tiny-demo-lora", source_dir=tmp_path / "a", base=world.version
    )
    second, created_again = model_version_register(
        model_name="tiny-demo-lora", source_dir=tmp_path / "b", base=world.version
    )
    assert created and not created_again and first.pk == second.pk
    assert first.is_adapter and first.manifest["base"] == world.version.digest
    assert {f["path"] for f in first.manifest["files"]} == {
        "adapter_config.json",
        "adapter_model.safetensors",
    }


def test_another_seed_is_another_version_and_an_existing_directory_is_refused(
    tmp_path, world, demo_model_dir
):
    call_command("build_demo_adapter", "--out", str(tmp_path / "a"), "--base", str(demo_model_dir))
    call_command(
        "build_demo_adapter", "--out", str(tmp_path / "b"), "--base", str(demo_model_dir),
        "--seed", "2",
    )  # fmt: skip
    a, _ = model_version_register(model_name="x", source_dir=tmp_path / "a", base=world.version)
    b, _ = model_version_register(model_name="x", source_dir=tmp_path / "b", base=world.version)
    assert a.digest != b.digest
    with pytest.raises(CommandError, match="already exists"):
        call_command(
            "build_demo_adapter", "--out", str(tmp_path / "a"), "--base", str(demo_model_dir)
        )
