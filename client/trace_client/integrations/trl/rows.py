"""TRACE's trees as rows of TRL's `GRPOTrainer` batch, and the rewards that make its group normalisation
hand each row TRACE's advantage (pure Python: no torch, no TRL).

A row is a stretch of one root-to-leaf path whose turns share one advantage: the row's prompt is the
prompt and every earlier turn of the path (context, never trained), its completion is the stretch, and
its loss mask is the turns' own mask (0 on tool and environment tokens). Along a path the advantage
`A(y) = (V̂(y) − V̂(parent)) + (V̂(y) − V̂(root))` changes only at a rollout's first turn and next to a
node that branched, so a rollout of any number of turns makes about two rows (`rows_per_bare_rollout`
bounds them). A turn shared by several paths is trained once, on the first (`tree_paths`).

TRL gives every row one advantage, `reward − mean(rewards of its group)` (with `scale_rewards="none"`),
where a group is `num_generations` consecutive rows. `pack_rows` puts at most `num_generations − 1` rows
in each group and fills the rest with filler rows: one pad token of completion, loss mask 0 (nothing of
them is trained), whose rewards are set so that the group's mean reward is 0. Each real row's reward is
its advantage, so TRL's advantage is exactly TRACE's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from trace_client.adapters import Segment, tree_paths
from trace_client.driver import FinishedTree


class RowCapacityError(RuntimeError):
    """A step's trees made more rows than the trainer's generation batch has room for."""


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One row of the trainer's batch: turns of one path that share one advantage.

    `prompt_ids` is the prompt followed by every earlier turn of the path; `node_ids` are the turns the row
    trains; `leaf_reward` is the reward of the path's leaf.
    """

    tree_id: str
    prompt_id: str
    node_ids: tuple[str, ...]
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    advantage: float
    leaf_reward: float


def training_rows(finished: FinishedTree, prompt_ids: Sequence[int]) -> list[TrainingRow]:
    """The tree's rows, path by path in node order. Every turn on a kept path must carry its tokens.

    A stretch whose loss mask is all 0 (only tool or environment tokens) has nothing to train and makes
    no row; its tokens are context for the rows after it.
    """
    rows: list[TrainingRow] = []
    for path in tree_paths(finished):
        context = list(prompt_ids)
        stretch: list[Segment] = []
        for segment in path.segments:
            if segment.turn.tokens is None:
                raise ValueError(
                    f"tree {path.group}: turn {segment.node_id} carries no tokens; "
                    "next_turn must fill TurnResult.tokens"
                )
            if not segment.trained:
                context.extend(segment.turn.tokens.ids)
                continue
            if stretch and not _same_advantage(stretch[0].advantage, segment.advantage):
                rows.append(_row(path.group, path.prompt.prompt_id, context, stretch, path.reward))
                context.extend(i for s in stretch if s.turn.tokens for i in s.turn.tokens.ids)
                stretch = []
            stretch.append(segment)
        if stretch:
            rows.append(_row(path.group, path.prompt.prompt_id, context, stretch, path.reward))
    return [row for row in rows if any(row.loss_mask)]


def _same_advantage(a: float, b: float) -> bool:
    # Turns below one unbranched chain get bit-equal values from the service; the tolerance only keeps
    # a rounding difference from splitting a row.
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


def _row(
    tree_id: str, prompt_id: str, context: Sequence[int], stretch: Sequence[Segment], reward: float
) -> TrainingRow:
    ids: list[int] = []
    mask: list[int] = []
    for segment in stretch:
        tokens = segment.turn.tokens
        assert tokens is not None  # checked by the caller
        ids.extend(tokens.ids)
        mask.extend(tokens.loss_mask)
    return TrainingRow(
        tree_id=tree_id,
        prompt_id=prompt_id,
        node_ids=tuple(segment.node_id for segment in stretch),
        prompt_ids=tuple(context),
        completion_ids=tuple(ids),
        loss_mask=tuple(mask),
        advantage=stretch[0].advantage,
        leaf_reward=reward,
    )


def rows_per_bare_rollout(expansion: float, max_turns: int) -> float:
    """The most rows one bare rollout of an allocation can make, with its share of continuations.

    A budget of `m` bare rollouts brings at most `m·N` continuations (`N` = expansion). A row starts at
    the first turn of a path (`m + m·N` of them), at a second turn (one per bare rollout), at the turn
    right after a node that branched, and at the turn after that (two per continuation): `2 + 4N` in
    all. Each rollout also makes at most `max_turns` turns, hence at most `(1 + N)·max_turns` rows.
    """
    return min(2.0 + 4.0 * expansion, (1.0 + expansion) * max_turns)


def row_capacity(slots: int, group_size: int) -> int:
    """Rows a generation batch of `slots` rows in groups of `group_size` holds (one filler per group)."""
    if group_size < 2:
        raise ValueError(f"groups need at least 2 rows (a row and its filler), got {group_size}")
    if slots % group_size:
        raise ValueError(
            f"the generation batch ({slots} rows on this process) must hold whole groups of "
            f"num_generations={group_size}"
        )
    return slots // group_size * (group_size - 1)


def safe_budget(slots: int, group_size: int, expansion: float, max_turns: int) -> int:
    """The most bare rollouts whose rows always fit the batch (`rows_per_bare_rollout`)."""
    return math.floor(row_capacity(slots, group_size) / rows_per_bare_rollout(expansion, max_turns))


@dataclass(frozen=True, slots=True)
class PackedSlot:
    """One slot of the generation batch: a row, or a filler (None), and the reward TRL gets for it."""

    row: TrainingRow | None
    trl_reward: float


def pack_rows(rows: Sequence[TrainingRow], slots: int, group_size: int) -> list[PackedSlot]:
    """The rows in `slots` slots, `group_size − 1` rows at most per group and fillers after them.

    Each row's reward is its advantage; a group's fillers share the negated sum of its rows' advantages,
    so the group's mean reward is 0 and `reward − mean` is the row's advantage.
    """
    per_group = group_size - 1
    capacity = row_capacity(slots, group_size)
    if len(rows) > capacity:
        raise RowCapacityError(
            f"the step's trees made {len(rows)} rows, and the generation batch holds {capacity} "
            f"({slots} slots in groups of {group_size}, one filler each): lower TraceSettings.budget or "
            "leave it unset (then it is sized so that the rows always fit), or enlarge the generation batch"
        )
    packed: list[PackedSlot] = []
    for group in range(slots // group_size):
        chunk = rows[group * per_group : (group + 1) * per_group]
        fillers = group_size - len(chunk)
        balance = -sum(row.advantage for row in chunk) / fillers
        packed.extend(PackedSlot(row, row.advantage) for row in chunk)
        packed.extend(PackedSlot(None, balance) for _ in range(fillers))
    return packed
