"""Output capping: the max_tokens that lets a late request finish before its deadline."""

from __future__ import annotations

from dataplane.types import Status, usage_for
from inference.pipeline.capping import job_capped, max_tokens_fitting, max_tokens_within
from tests.jobs import job_new


def _fitting(
    *,
    seconds_left: float = 10.0,
    wait_seconds: float = 0.0,
    seconds_per_token: float = 0.05,
    choices: int = 1,
    floor: int = 16,
) -> int | None:
    """A 20-token prompt's cap."""
    return max_tokens_fitting(
        seconds_left=seconds_left,
        wait_seconds=wait_seconds,
        seconds_per_token=seconds_per_token,
        prompt_tokens=20,
        choices=choices,
        floor=floor,
    )


def test_it_fits_the_tokens_left_after_the_wait_and_the_prompt():
    # 10 s at 0.05 s a token serve 200 tokens: 20 of prompt, 180 of output.
    assert _fitting() == 180
    # Waiting 4 s first leaves 6 s: 120 tokens, 100 of output.
    assert _fitting(wait_seconds=4.0) == 100


def test_it_shares_the_tokens_between_the_choices():
    assert _fitting(choices=3) == 60


def test_it_rounds_down_so_the_cap_never_passes_the_deadline():
    assert _fitting(seconds_left=10.04) == 180


def test_it_caps_at_nothing_below_the_floor():
    # 2 s serve 40 tokens: 20 of output, then 16 is still allowed and 17 is not.
    assert _fitting(seconds_left=2.0, floor=16) == 20
    assert _fitting(seconds_left=2.0, floor=21) is None


def test_it_caps_at_nothing_when_the_wait_alone_passes_the_deadline():
    assert _fitting(wait_seconds=12.0) is None


def test_it_caps_at_nothing_without_a_measured_rate():
    assert _fitting(seconds_per_token=0.0) is None


def test_within_a_tokens_per_minute_it_fits_what_is_left_after_the_prompt():
    assert max_tokens_within(tokens_left=300, prompt_tokens=20, choices=1, floor=16) == 280
    assert max_tokens_within(tokens_left=300, prompt_tokens=20, choices=3, floor=16) == 93
    assert max_tokens_within(tokens_left=30, prompt_tokens=20, choices=1, floor=16) is None
    assert max_tokens_within(tokens_left=10, prompt_tokens=20, choices=1, floor=16) is None


def test_a_capped_job_runs_with_the_cap_and_its_usage_record_names_it():
    job = job_new("d", max_tokens=500)
    capped = job_capped(job, 120)
    assert (capped.sampling.max_tokens, capped.max_tokens_requested) == (120, 500)
    assert capped.reserved_tokens == 3 + 120
    usage = usage_for(capped, status=Status.OK, finished_at=0.0)
    assert usage.capped_max_tokens == 120
    assert usage_for(job, status=Status.OK, finished_at=0.0).capped_max_tokens == 0
