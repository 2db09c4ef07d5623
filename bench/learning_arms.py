"""The arms of the learners (`bench/learning.py`, `bench/lm/`): an allocation rule with its budget, the
tree advantage it trains on and its ablations (`<arm>@<advantage>`, `<arm>+pilot`, `<arm>-shape`,
`<arm>~<share>`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from bench.advantages import ADVANTAGES
from trace_proto import DEFAULT_CONTROL_SHARE, PREDICTOR_POLICIES, AllocateRequest, Policy, PromptIn
from trace_service.allocation import POLICIES, continuation_budget

UNIFORM = "uniform"
UNIFORM_TREE = "uniform_tree"
ORACLE = "oracle"
ORACLE_JOINT = "oracle_joint"
ORACLE_SHARED = "oracle_shared"


@dataclass(frozen=True)
class Arm:
    """An allocation rule and its budget; `policy` None is an in-process oracle whose rules are those of
    `oracle_of` (`trace`: the joint Stage 1 objective; `trace_paper`: the paper's)."""

    name: str
    policy: Policy | None
    budget: int
    expansion: float
    oracle_of: Policy = Policy.TRACE
    #: The tree advantage it trains on: a `bench.advantages` name (arm `<arm>@<name>` on the command line).
    advantage: str = "service"
    #: The share of M spent in a first wave over the pool, before the rest is allocated with the first
    #: wave's outcomes in the prompts' history (arm `<arm>+pilot`; 0: one allocation per step).
    pilot: float = 0.0
    #: The request's control share ε (arm `<arm>~<share>`; the contract's default otherwise).
    control_share: float = DEFAULT_CONTROL_SHARE
    #: The request's `shape_from_evidence` (arm `<arm>-shape`: false, every tree deep).
    shape_from_evidence: bool = True

    def request(
        self, *, job: str, step: int, budget: int, prompts: list[PromptIn], **limits: Any
    ) -> AllocateRequest:
        """The arm's allocation over ``prompts``: its policy, expansion, control share and shape; ``limits``
        are the request's other fields."""
        assert self.policy is not None, "the oracle allocates in process"
        return AllocateRequest(
            job=job,
            step=step,
            budget=budget,
            expansion=self.expansion,
            policy=self.policy,
            control_share=self.control_share,
            shape_from_evidence=self.shape_from_evidence,
            prompts=prompts,
            **limits,
        )

    @property
    def flat(self) -> bool:
        """Bare rollouts only: its groups are GRPO groups."""
        return self.expansion == 0

    @property
    def reads_predictor(self) -> bool:
        """Whether its rules read Ṽ (`PREDICTOR_POLICIES`): only those wait for their job's predictor to
        train."""
        return self.policy in PREDICTOR_POLICIES

    @property
    def waves(self) -> list[int]:
        """The bare rollouts of each allocation in a step: M at once, or the pilot's share of it first."""
        pilot = round(self.pilot * self.budget)
        return [pilot, self.budget - pilot] if 0 < pilot < self.budget else [self.budget]

    @property
    def mixed_groups_only(self) -> bool:
        """DAPO's dynamic sampling keeps only the mixed groups for training."""
        return self.policy is not None and POLICIES[self.policy].keeps_only_mixed_groups


#: An arm named `<arm>+pilot` allocates twice per step (`Arm.pilot`).
PILOT_SUFFIX = "+pilot"
#: An arm named `<arm>~<share>` allocates with that control share (`Arm.control_share`).
SHARE_MARK = "~"
#: An arm named `<arm>-shape` allocates with the shape's draw off (`Arm.shape_from_evidence`).
FIXED_SHAPE_SUFFIX = "-shape"


def variant_arm(name: str, known: dict[str, Arm], pilot_share: float) -> Arm | None:
    """The ablation `name` names, None when it names none: `<arm>~<share>` allocates with another control
    share; `<arm>@<advantage>` trains on another tree advantage; `<arm>+pilot` (an arm of the service,
    after any `@<advantage>`) allocates in two waves; `<arm>-shape` (an arm of the service, after any
    `+pilot`) keeps every tree deep."""
    named, _, share = name.partition(SHARE_MARK)
    fixed_shape = named.endswith(FIXED_SHAPE_SUFFIX)
    named = named.removesuffix(FIXED_SHAPE_SUFFIX)
    piloted = named.endswith(PILOT_SUFFIX)
    base, _, advantage = named.removesuffix(PILOT_SUFFIX).partition("@")
    arm = known.get(base)
    if arm is None or base == UNIFORM or (advantage and advantage not in ADVANTAGES):
        return None
    if (piloted or share or fixed_shape) and arm.policy is None:
        return None
    try:
        control_share = float(share) if share else arm.control_share
    except ValueError:
        return None
    if not 0.0 <= control_share <= 1.0:
        return None
    return replace(
        arm,
        name=name,
        advantage=advantage or arm.advantage,
        pilot=pilot_share if piloted else 0.0,
        control_share=control_share,
        shape_from_evidence=not fixed_shape,
    )


def build_arms(bare: int, expansion: float) -> list[Arm]:
    """uniform, every policy of the contract at (M, N), and the oracle, all at R = M + ⌊M·N⌋ rollouts."""
    total = bare + continuation_budget(bare, expansion)
    arms = [Arm(UNIFORM, Policy.UNIFORM, total, 0.0)]
    arms += [
        Arm(UNIFORM_TREE if policy is Policy.UNIFORM else policy.value, policy, bare, expansion)
        for policy in Policy
    ]
    arms.append(Arm(ORACLE, None, bare, expansion))
    arms.append(Arm(ORACLE_JOINT, None, bare, expansion, Policy.TRACE_JOINT))
    arms.append(Arm(ORACLE_SHARED, None, bare, expansion, Policy.TRACE_SHARED))
    return arms
