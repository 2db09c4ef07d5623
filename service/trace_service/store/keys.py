"""Every Redis key the service uses, in one place (arq's discipline: one prefix, every key expires).

All keys of one tree share the hash tag ``{t:<tree_id>}`` so that the tree's Lua scripts touch a single
slot on Redis Cluster; a job's keys, its predictor's included, share ``{j:<job>}``; the keys about
every job's predictor share ``{predictor}``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TreeKeys:
    meta: str
    nodes: str
    events: str
    instructions: str
    predictions: str

    @property
    def all(self) -> list[str]:
        return [self.meta, self.nodes, self.events, self.instructions, self.predictions]


@dataclass(frozen=True)
class KeySpace:
    prefix: str = "trace"

    def tree(self, tree_id: str) -> TreeKeys:
        base = f"{self.prefix}:{{t:{tree_id}}}"
        return TreeKeys(f"{base}:meta", f"{base}:nodes", f"{base}:events", f"{base}:instr", f"{base}:pred")

    def _job(self, job: str) -> str:
        return f"{self.prefix}:{{j:{job}}}"

    def instruction_queue(self, job: str) -> str:
        return f"{self._job(job)}:queue"

    def open_trees(self, job: str) -> str:
        """Trees not yet complete (or whose completion is not yet accounted for): the sweeper's list."""
        return f"{self._job(job)}:open"

    def counted_trees(self, job: str) -> str:
        """Trees whose outcomes the prompt history already holds (so a repeat never counts twice)."""
        return f"{self._job(job)}:counted"

    def idempotency(self, job: str, key: str) -> str:
        return f"{self._job(job)}:idem:{key}"

    def prompt_outcomes(self, job: str) -> str:
        return f"{self._job(job)}:prompts"

    def step_trees(self, job: str, step: int) -> str:
        return f"{self._job(job)}:step:{step}"

    def continuation_reserve(self, job: str, allocation_id: str) -> str:
        """An allocation's shared continuation reserve (``trace_service.allocation.reserve``): its
        state and each tree's draw (``d:<tree_id>`` fields)."""
        return f"{self._job(job)}:reserve:{allocation_id}"

    def steps_info(self, job: str) -> str:
        """Per-allocation counts (``<step>:<allocation_id>`` fields): the prompts offered, trees made and
        bare rollouts promised."""
        return f"{self._job(job)}:stepinfo"

    def step_totals(self, job: str) -> str:
        """Per-step sums over the trees already counted (``<step>:<figure>`` fields): job stats keep
        them after the trees themselves expire."""
        return f"{self._job(job)}:steptotals"

    def group_outcomes(self, job: str, control: bool) -> str:
        """The job's most recent groups of one arm, its control trees' or its policy's (``GroupOutcome``,
        newest first, a capped list): what the predictor's trust on the job is fitted to; the control
        groups alone measure its calibration."""
        return f"{self._job(job)}:{'controls' if control else 'groups'}"

    def steps(self, job: str) -> str:
        return f"{self._job(job)}:steps"

    @property
    def jobs(self) -> str:
        return f"{self.prefix}:jobs"

    def job_pattern(self, job: str) -> str:
        """A SCAN pattern of every key of ``job`` (its name is letters, digits, '_', '.', '-': no glob)."""
        return f"{self._job(job)}:*"

    # --- a job's predictor ---------------------------------------------------------------------

    def completed_trees(self, job: str) -> str:
        """The job's completed trees waiting to become its predictor's training examples."""
        return f"{self._job(job)}:completed"

    def weights(self, job: str) -> str:
        """The job's published predictor weights (``version``, ``blob``): what every replica serves."""
        return f"{self._job(job)}:weights"

    def predictor_state(self, job: str) -> str:
        """The job's whole predictor, training data included, as its trainer last set it down."""
        return f"{self._job(job)}:predictor"

    def trainer_lease(self, job: str) -> str:
        return f"{self._job(job)}:trainer"

    @property
    def training_wanted(self) -> str:
        """The jobs with completed trees waiting for their predictor's trainer."""
        return f"{self.prefix}:{{predictor}}:wanted"

    @property
    def trained_jobs(self) -> str:
        """The jobs whose trainer lease is held, each scored by when it lapses (a sorted set)."""
        return f"{self.prefix}:{{predictor}}:trained"

    @property
    def trainers(self) -> str:
        """The replicas that train, each scored by when it last said so (a sorted set)."""
        return f"{self.prefix}:{{predictor}}:trainers"
