"""The driver's value types and configuration reject bad input with a clear ValueError."""

from __future__ import annotations

import math
from typing import Any

import pytest

from trace_client.driver import DriverConfig, History, TurnResult, TurnTokens
from trace_proto import PromptIn


def test_a_reward_needs_a_final_turn_and_a_finite_value() -> None:
    assert TurnResult(done=True, reward=1.0).reward == 1.0
    with pytest.raises(ValueError, match="done=True"):
        TurnResult(text="thinking", reward=1.0)
    with pytest.raises(ValueError, match="finite"):
        TurnResult(done=True, reward=math.nan)


def test_token_masks_and_logprobs_match_the_ids() -> None:
    assert TurnTokens((5, 6)).loss_mask == (1, 1)
    assert TurnTokens((5, 6), mask=(1, 0)).loss_mask == (1, 0)
    with pytest.raises(ValueError, match="mask has 1 entries for 2"):
        TurnTokens((5, 6), mask=(1,))
    with pytest.raises(ValueError, match="0 or 1"):
        TurnTokens((5,), mask=(2,))
    with pytest.raises(ValueError, match="logprobs has 3 entries for 2"):
        TurnTokens((5, 6), logprobs=(-0.1, -0.2, -0.3))


def test_a_history_grows_without_copying_its_prefix() -> None:
    start = History(PromptIn(prompt_id="p", text="task"), tree_id="t")
    first = TurnResult(text="a")
    one = start.then(first)
    two = one.then(TurnResult(text="b", done=True, reward=0.0))
    assert (start.depth, one.depth, two.depth) == (0, 1, 2)
    assert start.last_turn is None and one.last_turn is first
    assert two.turns[0] is first and two.prompt is start.prompt


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("concurrency", 0),
        ("batch_events", 0),
        ("batch_events", 4097),
        ("batch_trees", 0),
        ("batch_latency", 0.0),
        ("poll_interval", -1.0),
        ("max_turns", 0),
        ("turn_timeout", 0.0),
        ("step_timeout", -5.0),
        ("failure_reward", math.inf),
        ("progress_interval", 0.0),
    ],
)
def test_config_rejects_values_that_cannot_work(field: str, value: Any) -> None:
    with pytest.raises(ValueError, match=field):
        DriverConfig(**{field: value})
