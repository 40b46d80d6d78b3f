from __future__ import annotations

import datetime as dt
import json
import shutil
from decimal import Decimal

import pytest
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.core.management.base import CommandError
from django.utils import timezone

from billing.services import price_book_add, price_current
from models_registry.manifest import ArtifactError
from models_registry.models import ModelVersion
from models_registry.selectors import route_resolve
from models_registry.services import (
    deployment_create,
    model_version_register,
    model_version_verify,
)
from tenants.models import AppendOnlyError

pytestmark = pytest.mark.django_db


def _small_model(tmp_path, content: str = "weights"):
    source = tmp_path / "src"
    source.mkdir()
    (source / "config.json").write_text(json.dumps({"max_position_embeddings": 256}))
    (source / "weights.bin").write_text(content)
    return source


def test_registering_the_same_content_twice_is_idempotent(tmp_path, world):
    source = _small_model(tmp_path)
    first, created = model_version_register(model_name="small", source_dir=source)
    second, created_again = model_version_register(model_name="small", source_dir=source)
    assert created and not created_again
    assert first.pk == second.pk


def test_changed_content_is_a_new_version(tmp_path, world):
    first, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    other = tmp_path / "other"
    shutil.copytree(tmp_path / "src", other)
    (other / "weights.bin").write_text("different")
    second, created = model_version_register(model_name="small", source_dir=other)
    assert created and second.digest != first.digest


def test_a_registered_version_cannot_be_changed(tmp_path, world):
    version, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    version.max_model_len = 1
    with pytest.raises(AppendOnlyError):
        version.save()


def test_verification_names_a_tampered_file(tmp_path, world):
    version, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    stored = version.artifact_dir / "weights.bin"
    stored.chmod(0o644)
    stored.write_text("tampered")
    with pytest.raises(ArtifactError, match=r"weights\.bin \(size changed\)"):
        model_version_verify(version=version)


def test_a_worker_refuses_to_start_on_a_tampered_file(tmp_path, world):
    version, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    deployment_create(name="small-dep", version=version)
    stored = version.artifact_dir / "weights.bin"
    stored.chmod(0o644)
    stored.write_text("weightz")
    with pytest.raises(
        CommandError, match=r"refusing to start: .*weights\.bin \(sha256 mismatch\)"
    ):
        call_command("run_worker", "--deployment", "small-dep")


def test_the_alias_and_a_pinned_version_route_to_the_deployment(world):
    by_alias = route_resolve(name="tiny-chat", price_of=price_current)
    pinned = route_resolve(name=f"tiny-llama@{world.version.version}", price_of=price_current)
    assert by_alias is not None and pinned is not None
    assert by_alias.deployment == pinned.deployment == "tiny-chat"
    assert route_resolve(name="tiny-llama@000000000000", price_of=price_current) is None
    assert route_resolve(name="no-such-model", price_of=price_current) is None


def test_a_route_carries_the_price_in_force_now(world):
    listed = route_resolve(name="tiny-chat", price_of=price_current)
    assert listed is not None
    assert listed.price_input_per_1k == world.version.price_input_per_1k
    price_book_add(
        version=world.version,
        input_per_1k=Decimal("0.25"),
        output_per_1k=Decimal("0.75"),
        effective_from=timezone.now() - dt.timedelta(seconds=1),
    )
    booked = route_resolve(name="tiny-chat", price_of=price_current)
    assert booked is not None
    assert (booked.price_input_per_1k, booked.price_output_per_1k) == (
        Decimal("0.25"),
        Decimal("0.75"),
    )


def test_versions_are_content_addressed(world):
    assert ModelVersion.objects.get(pk=world.version.pk).digest.startswith(world.version.version)


def test_a_label_never_names_changed_content(tmp_path, world):
    first, _ = model_version_register(
        model_name="small", source_dir=_small_model(tmp_path), label="v1"
    )
    changed = tmp_path / "changed"
    shutil.copytree(tmp_path / "src", changed)
    (changed / "weights.bin").write_text("other weights")
    with pytest.raises(ValidationError, match=r"small v1 is already registered as small@"):
        model_version_register(model_name="small", source_dir=changed, label="v1")
    with pytest.raises(ValidationError, match=r"already registered as .* with label 'v1'"):
        model_version_register(model_name="small", source_dir=tmp_path / "src", label="v2")
    again, created = model_version_register(
        model_name="small", source_dir=tmp_path / "src", label="v1"
    )
    assert again.pk == first.pk and not created


def test_the_register_command_names_the_refusal(tmp_path, world):
    call_command("register_model", "small", str(_small_model(tmp_path)), "--label", "v1")
    (tmp_path / "src" / "weights.bin").write_text("tampered before re-registering")
    with pytest.raises(CommandError, match="small v1 is already registered"):
        call_command("register_model", "small", str(tmp_path / "src"), "--label", "v1")


def test_an_adapter_needs_an_adapter_config_and_a_full_base(tmp_path, world):
    with pytest.raises(ValidationError, match=r"adapter_config\.json"):
        model_version_register(
            model_name="small-lora", source_dir=_small_model(tmp_path), base=world.version
        )


def test_a_tool_parser_is_part_of_the_manifest_only_when_named(tmp_path, world):
    plain, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    tools, created = model_version_register(
        model_name="small", source_dir=tmp_path / "src", tool_parser="hermes"
    )
    assert "tool_parser" not in plain.manifest and plain.tool_parser == ""
    assert created and tools.manifest["tool_parser"] == "hermes"
    assert tools.tool_parser == "hermes" and tools.digest != plain.digest


def test_a_tool_parser_vllm_does_not_know_is_refused(tmp_path, world):
    with pytest.raises(ValidationError) as refused:
        model_version_register(
            model_name="small", source_dir=_small_model(tmp_path), tool_parser="hermes2"
        )
    assert "tool_parser" in refused.value.message_dict
    assert "'hermes2' is not a vLLM tool parser" in refused.value.message_dict["tool_parser"][0]
    assert not ModelVersion.objects.filter(model__name="small").exists()


def test_an_embedding_model_or_an_adapter_names_no_tool_parser(tmp_path, world):
    with pytest.raises(ValidationError, match="embedding model takes no tools"):
        model_version_register(
            model_name="small",
            source_dir=_small_model(tmp_path),
            task="embedding",
            tool_parser="hermes",
        )
    with pytest.raises(ValidationError, match="read by its base's tool parser"):
        model_version_register(
            model_name="small-lora",
            source_dir=tmp_path / "src",
            base=world.version,
            tool_parser="hermes",
        )


def test_a_reasoning_parser_is_part_of_the_manifest_and_vllm_must_know_it(tmp_path, world):
    plain, _ = model_version_register(model_name="small", source_dir=_small_model(tmp_path))
    thinking, created = model_version_register(
        model_name="small", source_dir=tmp_path / "src", reasoning_parser="qwen3"
    )
    assert "reasoning_parser" not in plain.manifest and plain.reasoning_parser == ""
    assert created and thinking.reasoning_parser == "qwen3" and thinking.digest != plain.digest
    with pytest.raises(ValidationError) as refused:
        model_version_register(
            model_name="small", source_dir=tmp_path / "src", reasoning_parser="qwen9"
        )
    assert (
        "'qwen9' is not a vLLM reasoning parser"
        in refused.value.message_dict["reasoning_parser"][0]
    )
    with pytest.raises(ValidationError, match="only a chat model reasons"):
        model_version_register(
            model_name="small", source_dir=tmp_path / "src", task="embedding",
            reasoning_parser="qwen3",
        )  # fmt: skip
    with pytest.raises(ValidationError, match="read by its base's parser"):
        model_version_register(
            model_name="small-lora", source_dir=tmp_path / "src", base=world.version,
            reasoning_parser="qwen3",
        )  # fmt: skip
    call_command("register_model", "small", str(tmp_path / "src"), "--label", "think",
                 "--reasoning-parser", "deepseek_r1")  # fmt: skip
    assert ModelVersion.objects.get(label="think").reasoning_parser == "deepseek_r1"


def test_the_register_command_takes_a_tool_parser(tmp_path, world):
    source = str(_small_model(tmp_path))
    call_command("register_model", "small", source, "--label", "v1", "--tool-parser", "hermes")
    assert ModelVersion.objects.get(model__name="small", label="v1").tool_parser == "hermes"
    with pytest.raises(CommandError, match="'nope' is not a vLLM tool parser"):
        call_command("register_model", "small", source, "--tool-parser", "nope")
