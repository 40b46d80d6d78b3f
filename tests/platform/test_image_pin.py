"""platform/image/pin.py: the digest `make image` writes into the chart's values."""

from __future__ import annotations

import importlib.util

import pytest
import yaml

from tests.platform.contract import ROOT

spec = importlib.util.spec_from_file_location("pin", ROOT / "platform" / "image" / "pin.py")
assert spec is not None and spec.loader is not None
pin = importlib.util.module_from_spec(spec)
spec.loader.exec_module(pin)

VALUES = """\
# The platform's image.
image:
  repository: ghcr.io/example/roundhouse
  tag: ""  # default: the chart's appVersion
  digest: ""
  pullPolicy: IfNotPresent
# The CUDA build.
gpuImage:
  repository: ghcr.io/example/roundhouse
  digest: ""  # written by make image EXTRA=gpu
workerDefaults:
  image: {}
"""
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def test_the_digest_lands_in_its_own_block_and_nothing_else_changes():
    pinned = pin.digest_pinned(VALUES, "gpuImage", B)
    values = yaml.safe_load(pinned)
    assert values["gpuImage"]["digest"] == B
    assert values["image"]["digest"] == ""
    assert f'  digest: "{B}"  # written by make image EXTRA=gpu\n' in pinned
    assert pinned.replace(B, "") == VALUES  # the comment kept, no other line touched
    again = pin.digest_pinned(pin.digest_pinned(pinned, "image", A), "image", A)
    assert yaml.safe_load(again)["image"]["digest"] == A
    assert len(again.splitlines()) == len(VALUES.splitlines())


def test_a_bad_digest_or_a_missing_block_is_refused():
    with pytest.raises(ValueError, match="not an image digest"):
        pin.digest_pinned(VALUES, "image", "sha256:short")
    with pytest.raises(ValueError, match=r"no workerDefaults\.digest line"):
        pin.digest_pinned(VALUES, "workerDefaults", A)


def test_the_charts_own_values_have_both_digest_lines():
    text = (ROOT / "platform" / "helm" / "roundhouse" / "values.yaml").read_text()
    for key in ("image", "gpuImage"):
        assert yaml.safe_load(pin.digest_pinned(text, key, A))[key]["digest"] == A
