"""Version 1 of the trace-rollout wire contract.

Paths and field names are fixed for v1: fields and endpoints may be added, none renamed or dropped.
Requests reject unknown fields; responses ignore them (see `common`). Limits are in `limits`, URL paths
and header names in `paths`.
"""

from trace_proto.v1 import limits, paths
from trace_proto.v1.allocate import (
    DEFAULT_CONTROL_SHARE,
    PREDICTOR_POLICIES,
    AllocateRequest,
    AllocateResponse,
    BudgetSplit,
    Policy,
    PromptIn,
    SkippedPrompt,
    TreeAllocation,
    TrustMap,
)
from trace_proto.v1.common import API_VERSION, DEFAULT_JOB, RequestModel, ResponseModel
from trace_proto.v1.errors import PROBLEM_MEDIA_TYPE, ErrorItem, ErrorResponse
from trace_proto.v1.events import (
    EventStatus,
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    Instruction,
    InstructionsQuery,
    InstructionsResponse,
    RejectedEvent,
)
from trace_proto.v1.health import Health, Ready
from trace_proto.v1.predictor import (
    HistoryIn,
    PredictorInfo,
    PredictRequest,
    PredictResponse,
    PriorInfo,
    TurnIn,
)
from trace_proto.v1.stats import (
    ArmTotals,
    ControlCalibration,
    GainEstimate,
    GainRatio,
    JobDeleted,
    JobStats,
    StepStats,
)
from trace_proto.v1.trees import TreeNode, TreeResponse, TreeStatus

#: Every request and response body (and the event envelope and the claim query): one JSON Schema each.
SCHEMA_MODELS: tuple[type[RequestModel] | type[ResponseModel], ...] = (
    AllocateRequest,
    AllocateResponse,
    ExpandEvent,
    ExpandRequest,
    ExpandResponse,
    InstructionsQuery,
    InstructionsResponse,
    TreeResponse,
    PredictorInfo,
    PredictRequest,
    PredictResponse,
    JobStats,
    JobDeleted,
    ErrorResponse,
    Health,
    Ready,
)

__all__ = [
    "API_VERSION",
    "DEFAULT_CONTROL_SHARE",
    "DEFAULT_JOB",
    "PREDICTOR_POLICIES",
    "PROBLEM_MEDIA_TYPE",
    "SCHEMA_MODELS",
    "AllocateRequest",
    "AllocateResponse",
    "ArmTotals",
    "BudgetSplit",
    "ControlCalibration",
    "ErrorItem",
    "ErrorResponse",
    "EventStatus",
    "ExpandEvent",
    "ExpandRequest",
    "ExpandResponse",
    "GainEstimate",
    "GainRatio",
    "Health",
    "HistoryIn",
    "Instruction",
    "InstructionsQuery",
    "InstructionsResponse",
    "JobDeleted",
    "JobStats",
    "Policy",
    "PredictRequest",
    "PredictResponse",
    "PredictorInfo",
    "PriorInfo",
    "PromptIn",
    "Ready",
    "RejectedEvent",
    "RequestModel",
    "ResponseModel",
    "SkippedPrompt",
    "StepStats",
    "TreeAllocation",
    "TreeNode",
    "TreeResponse",
    "TreeStatus",
    "TrustMap",
    "TurnIn",
    "limits",
    "paths",
]
