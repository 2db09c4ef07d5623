"""--family and --tune-on: the tuned-on family is never reported."""

from __future__ import annotations

import argparse

import pytest

from bench.protocol import (
    add_family_arguments,
    check_sizes,
    chosen_families,
    comma_list,
    mean_std,
    protocol_line,
)

KNOWN = ["react", "math", "multihop", "toolcall"]


def families(*argv: str) -> list[str]:
    parser = argparse.ArgumentParser()
    add_family_arguments(parser, "all")
    return chosen_families(parser, parser.parse_args(argv), KNOWN)


def test_every_family_by_default_in_registry_order() -> None:
    assert families() == KNOWN


def test_a_comma_list_keeps_its_order() -> None:
    assert families("--family", "toolcall, math") == ["toolcall", "math"]


def test_tune_on_leaves_its_family_out() -> None:
    assert families("--tune-on", "math") == ["react", "multihop", "toolcall"]
    assert families("--family", "math,toolcall", "--tune-on", "math") == ["toolcall"]


@pytest.mark.parametrize(
    "argv", [("--family", "chess"), ("--tune-on", "chess"), ("--family", "math", "--tune-on", "math")]
)
def test_unknown_or_empty_selections_are_errors(argv: tuple[str, ...]) -> None:
    with pytest.raises(SystemExit):
        families(*argv)


def test_the_output_says_what_was_held_out() -> None:
    line = protocol_line(argparse.Namespace(tune_on="math"), ["react", "toolcall"])
    assert "Tuned on math" in line and "react, toolcall" in line


def test_a_comma_list_drops_blanks_and_keeps_its_order() -> None:
    assert comma_list(" uniform, ,trace@loo,") == ["uniform", "trace@loo"]


def test_mean_std_is_the_sample_deviation_and_zero_for_one_value() -> None:
    assert mean_std([1.0, 2.0, 6.0]) == (pytest.approx(3.0), pytest.approx(7.0**0.5))  # Σ(x − 3)² / 2 = 7
    assert mean_std([0.25]) == (0.25, 0.0)


@pytest.mark.parametrize(("seeds", "pool", "prompts"), [(0, 2, 4), (1, 0, 4), (1, 5, 4)])
def test_sizes_below_one_or_a_pool_over_the_prompts_are_errors(seeds: int, pool: int, prompts: int) -> None:
    args = argparse.Namespace(seeds=seeds, pool=pool, prompts=prompts)
    with pytest.raises(SystemExit):
        check_sizes(argparse.ArgumentParser(), args, ("seeds", "pool"))


def test_a_pool_of_every_prompt_is_allowed() -> None:
    check_sizes(argparse.ArgumentParser(), argparse.Namespace(seeds=1, pool=4, prompts=4), ("seeds", "pool"))
