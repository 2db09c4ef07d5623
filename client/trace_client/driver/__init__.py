"""The worker driver: one training step of allocate → bare rollouts → expand → continuations, run around
two user callables; or one tree of an allocation, for a framework whose rollout loop runs per prompt.

    async def next_turn(history: History) -> TurnResult: ...   # one agent turn (sync is fine too)

    async with AsyncTraceClient("http://trace:8000") as client:
        driver = RolloutDriver(client, next_turn, score=score, config=DriverConfig(concurrency=64))
        result = await driver.run_step(AllocateRequest(job="run-7", step=12, budget=512, prompts=pool))
    for finished in result.trees:  # TreeResponse with values and advantages, plus the turns that were run
        ...

What one step does:

1. `POST /v1/allocate` with the request (the pool and the allocation knobs).
2. Runs every tree's bare rollouts, at most `concurrency` rollouts at a time. Each finished turn becomes
   an event with a client-made `event_id` (`<tree_id>:<node_id>`) fixed when the turn is made, so a batch
   sent again after a lost answer is acknowledged as duplicates, never counted twice.
3. Sends events in batches (at most `batch_events` events of at most `batch_trees` trees per request;
   an event waits at most `batch_latency`), one request at a time and each tree's events in order, so a
   parent always reaches the service before its child.
4. Starts continuations from the exact history that ends at each instructed node (the driver keeps every
   node's `History`, including each turn's opaque `state`). Instructions come inline in `/v1/expand`
   answers; while a tree waits on the service with no local work, the driver also claims leased ones
   (`GET /v1/instructions`) and checks the tree's status.
5. Returns when every tree is complete (or closed), with each tree as `GET /v1/trees/{id}` exports it.

Per tree. A framework that hands out one prompt at a time (verl's agent loop, AReaL's `arun_episode`)
allocates the step itself and calls `run_tree(tree, prompt, job=..., step=...)` once per allocated tree,
concurrently, from one event loop. The calls of one job share one reporter, one rollout limit and one
poller (the same core as `run_step`), so their events still travel in shared batches; each call
returns its own `FinishedTree` as soon as that tree completes.

Failures. A callable that raises (or returns something that is not a `TurnResult`, or runs past
`turn_timeout`, or never ends its rollout within `max_turns`) fails only its own rollout: the driver
reports one more turn, a leaf whose text says what went wrong and whose reward is `failure_reward`
(default 0), so the tree's budget accounting still closes and the tree completes. The failure is listed
in `FinishedTree.failures`; trainer adapters leave such leaves out of the batch. A tree that nothing can
finish any more (an event of it was rejected, or its bare rollouts cannot all be scored) is closed with
`POST /v1/trees/{id}/close` as soon as it has no local work left. Nothing waits forever: past
`step_timeout` the driver cancels the rollouts still running, reports what was already done, closes the
remaining trees and returns them with `StepResult.timed_out` set (`run_tree`: the same for its one tree,
which comes back closed).

Limits. Claims are per job: instructions of trees this driver did not allocate are left to their lease
(they are offered again after the service's lease time), so run one driver per job and step. When an
`/v1/expand` answer carrying instructions is lost in transit, the resend is acknowledged as duplicates
without them, and they are claimed only once their lease (inline instructions start leased to the
caller) runs out. A blocking synchronous callable blocks the event loop unless `threaded=True` runs it in
a worker thread.
"""

from trace_client.driver.run import RolloutDriver
from trace_client.driver.types import (
    DriverConfig,
    FinishedTree,
    History,
    NextTurn,
    Progress,
    ProgressCallback,
    Score,
    StepResult,
    TurnRecorded,
    TurnResult,
    TurnTokens,
)

__all__ = [
    "DriverConfig",
    "FinishedTree",
    "History",
    "NextTurn",
    "Progress",
    "ProgressCallback",
    "RolloutDriver",
    "Score",
    "StepResult",
    "TurnRecorded",
    "TurnResult",
    "TurnTokens",
]
