"""The life-cycle module: the one definition of the statuses, event codes and rules, and the Lua
prelude every store script runs with."""

from __future__ import annotations

import re
from importlib import resources

import pytest

from trace_proto import EventStatus, TreeStatus
from trace_service.allocation import round_budgets
from trace_service.allocation.books import round_share
from trace_service.lifecycle import FINISHED, LUA_PRELUDE, TRANSITIONS, is_mixed, is_success
from trace_service.store.runner import SCRIPTS, script_source


def own_sources() -> dict[str, str]:
    folder = resources.files("trace_service.store").joinpath("scripts")
    return {name: folder.joinpath(f"{name}.lua").read_text() for name in SCRIPTS}


def test_every_script_file_is_loaded_and_runs_with_the_prelude() -> None:
    folder = resources.files("trace_service.store").joinpath("scripts")
    assert {entry.name.removesuffix(".lua") for entry in folder.iterdir()} == set(SCRIPTS)
    for name, own in own_sources().items():
        assert script_source(name) == LUA_PRELUDE + own


def test_the_prelude_names_every_status_and_event_code() -> None:
    for status in TreeStatus:
        assert f"{status.name} = '{status.value}'" in LUA_PRELUDE
    for code in EventStatus:
        assert f"{code.name} = {int(code)}" in LUA_PRELUDE
    assert "local FINISHED = {closed = true, complete = true}" in LUA_PRELUDE


def test_the_prelude_is_data_and_no_script_defines_a_rule_of_the_life_cycle() -> None:
    """The rules are Python's (``allocation.books``, ``lifecycle.is_success``): the prelude holds names
    only, and no script computes a budget, a success or a next status of its own."""
    assert "function" not in LUA_PRELUDE
    for name, own in own_sources().items():
        for rule in ("budget_left", "settled_status", "is_success", "threshold"):
            assert rule not in own, (name, rule)


def test_no_script_spells_out_a_status_or_an_event_code() -> None:
    """The scripts use STATUS.* and RESULT.*: a status string or event code written out is a second
    definition."""
    statuses = re.compile("|".join(rf"['\"]{status.value}['\"]" for status in TreeStatus))
    event_codes = re.compile(r"\b(" + "|".join(str(int(code)) for code in EventStatus) + r")\b")
    for name, own in own_sources().items():
        code_lines = [line for line in own.splitlines() if not line.lstrip().startswith("--")]
        assert not [line for line in code_lines if statuses.search(line)], name
        assert not [line for line in code_lines if event_codes.search(line)], name


def test_the_transitions_cover_every_status_and_finished_trees_stay_finished() -> None:
    assert set(TRANSITIONS) == set(TreeStatus)
    assert {TreeStatus.COMPLETE, TreeStatus.CLOSED} == FINISHED
    for status in FINISHED:
        assert TRANSITIONS[status] == frozenset()
    for status in set(TreeStatus) - FINISHED:
        assert TreeStatus.CLOSED in TRANSITIONS[status]
        assert TreeStatus.COLLECTING not in TRANSITIONS[status]


@pytest.mark.parametrize(("reward", "success"), [(0.5, True), (0.4999, False), (1.0, True), (-1.0, False)])
def test_a_reward_at_the_threshold_is_a_success(reward: float, success: bool) -> None:
    assert is_success(reward, 0.5) is success


@pytest.mark.parametrize(
    ("successes", "leaves", "mixed"),
    [(0, 0, False), (0, 3, False), (1, 3, True), (2, 3, True), (3, 3, False)],
)
def test_a_group_is_mixed_when_it_holds_a_success_and_a_failure(
    successes: int, leaves: int, mixed: bool
) -> None:
    assert is_mixed(successes, leaves) is mixed


def test_a_round_shares_the_budget_of_the_rounds_so_far_less_what_was_decided() -> None:
    assert round_budgets(5, 2) == [3, 2]
    assert round_share(5, 5, 2, 1) == 3  # nothing decided yet: round 2 keeps its 2
    assert round_share(2, 5, 2, 2) == 2  # round 1 promised 2 and returned 1: 2 left
    assert round_share(4, 5, 2, 2) == 4  # round 1 placed one of its three and returned none
    assert round_share(0, 5, 2, 2) == 0  # nothing left
