"""A predictor per training job: each learns only from its own trees, is set down and loaded back
whole, is served by every replica, starts from another job's weights on request, and goes with its job.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest
from engine_support import Wired, predictors_of, wire
from prometheus_client import CollectorRegistry
from support import make_settings, rollout

from trace_proto import AllocateRequest, Policy, PromptIn
from trace_service.metrics import Metrics
from trace_service.predictor import Query
from trace_service.predictor.job_predictors import PredictorRegistry, UnknownPredictorError

PROMPTS = 12


async def complete_step(wired: Wired, job: str, step: int, success: float, **request: object) -> None:
    """One step of ``job`` on the same prompt ids, every rollout succeeding as told, its trees complete."""
    allocation = AllocateRequest.model_validate(
        {
            "job": job,
            "step": step,
            "budget": 4 * PROMPTS,
            "expansion": 0.0,
            "policy": Policy.UNIFORM,
            "prompts": [PromptIn(prompt_id=f"p{i}", text=f"solve task {i}") for i in range(PROMPTS)],
            **request,
        }
    )
    answer = await wired.engine.allocation.allocate(allocation, None)
    events = [
        event
        for tree in answer.trees
        for _ in range(tree.rollouts)
        for event in rollout(tree.tree_id, None, 2, success)
    ]
    assert (await wired.engine.intake.expand(events)).accepted == len(events)


async def train_job(wired: Wired, job: str, success: float, steps: int = 3, **request: object) -> None:
    """``steps`` steps of ``job`` (``complete_step``), each followed by a round of the predictors'
    background work."""
    for step in range(steps):
        await complete_step(wired, job, step, success, **(request if step == 0 else {}))
        await wired.engine.predictors.refresh(train=True)


async def unseen(registry: PredictorRegistry, job: str) -> float:
    """The job's Ṽ for a prompt it has never seen (its network and calibration, no history of it)."""
    root = registry.featurizer.encode_prompt("never-seen", "solve task 999")
    _, values = await (await registry.get(job)).predict([Query(root)])
    return float(values[0])


def replica_of(wired: Wired) -> PredictorRegistry:
    """Another replica's predictors, on the same store."""
    return predictors_of(wired.store, Metrics(CollectorRegistry()), wired.settings)


async def test_two_jobs_with_opposite_outcomes_on_the_same_prompts_each_learn_their_own(wired: Wired) -> None:
    predictors = wired.engine.predictors
    assert await unseen(predictors, "solves") == await unseen(predictors, "fails")  # both start clean
    await train_job(wired, "solves", 1.0)
    await train_job(wired, "fails", 0.0)
    solves, fails = await unseen(predictors, "solves"), await unseen(predictors, "fails")
    # One predictor trained on both would give this prompt one value; each job's follows its outcomes.
    assert solves > 0.8 and fails < 0.2, (solves, fails)
    for job in ("solves", "fails"):
        info = await (await predictors.get(job)).info()
        assert info.job == job and info.version >= 1 and info.examples_seen > 0
        assert wired.sample("trace_predictor_version", {"training_job": job}) == info.version
        assert wired.sample("trace_predictor_examples_total", {"training_job": job}) >= info.examples_seen
    assert await predictors.store.training_wanted() == []  # every completed tree was trained on


async def test_a_predictor_set_down_and_loaded_back_has_lost_nothing() -> None:
    async with wire(make_settings(predictor_max_jobs=1)) as wired:  # room for one job's predictor
        await set_down_and_load_back(wired)


async def set_down_and_load_back(wired: Wired) -> None:
    predictors = wired.engine.predictors
    await train_job(wired, "first", 1.0, steps=2)
    first = await predictors.get("first")
    probe = [Query(predictors.featurizer.encode_prompt(f"p{i}", f"solve task {i}")) for i in range(4)]
    version, before = await first.predict(probe)
    info, replay = await first.info(), len(first.predictor._replay)
    await train_job(wired, "second", 0.0, steps=1)  # only one fits: the first is set down
    await asyncio.gather(*predictors._setting_down.values())
    assert "first" not in predictors._resident
    assert await wired.store.load_predictor("first") is not None
    reloaded = await predictors.get("first")
    assert reloaded is not first
    assert (await reloaded.predict(probe))[0] == version
    np.testing.assert_array_equal((await reloaded.predict(probe))[1], before)
    assert await reloaded.info() == info
    assert len(reloaded.predictor._replay) == replay > 0
    assert wired.sample("trace_predictor_evictions_total") >= 1
    # It trains on from where it was: the next step's trees add to the same buffer.
    await train_job(wired, "first", 1.0, steps=1)
    assert len((await predictors.get("first")).predictor._replay) > replay


async def test_a_replica_serves_a_job_another_replica_trained(wired: Wired) -> None:
    await train_job(wired, "job", 1.0)
    trainer = await wired.engine.predictors.get("job")
    other = replica_of(wired)
    served = await other.get("job")
    assert served.version == trainer.version >= 1
    probe = [Query(other.featurizer.encode_prompt("p1", "solve task 1"))]
    np.testing.assert_array_equal((await served.predict(probe))[1], (await trainer.predict(probe))[1])
    await train_job(wired, "job", 1.0, steps=1)  # the trainer publishes a newer version
    await other.refresh(train=False)
    assert served.version == trainer.version


async def test_a_replica_taking_a_jobs_lease_trains_on_from_what_its_trainer_set_down(wired: Wired) -> None:
    await train_job(wired, "job", 1.0, steps=2)
    first = wired.engine.predictors
    replay = len((await first.get("job")).predictor._replay)
    other = replica_of(wired)
    serving = await other.get("job")  # the copy a serving replica holds: weights, no training data
    assert serving.version >= 1 and len(serving.predictor._replay) == 0
    await first.close(
        seconds=30.0
    )  # the trainer stops: the job's whole predictor is in the store, its lease free
    await complete_step(wired, "job", 2, 1.0)
    await other.refresh(train=True)
    trained = await other.get("job")
    assert "job" in other._leases
    assert len(trained.predictor._replay) > replay > 0  # the set-down buffer, and the new step's trees


async def test_training_many_jobs_spreads_over_the_trainers(wired: Wired) -> None:
    for job in ("a", "b", "c", "d"):
        await train_job(wired, job, 1.0, steps=1)  # trained here: this replica holds the four leases
    mine = wired.engine.predictors
    assert mine._leases == {"a", "b", "c", "d"}
    for job in ("a", "b", "c", "d"):
        await mine.store.release_trainer_lease(job, mine.owner)
    mine._leases.clear()
    for job in ("a", "b", "c", "d"):  # every job wants training again
        await mine.store.push_completed(job, "no-such-tree")
    assert await mine.store.trained_jobs(time.time()) == []
    other = replica_of(wired)
    await mine.store.trainers(other.owner, now=time.time(), ttl=60.0)
    await mine.refresh(train=True)
    await other.refresh(train=True)
    assert len(mine._leases) == len(other._leases) == 2
    assert mine._leases | other._leases == {"a", "b", "c", "d"}


async def test_a_job_past_every_trainers_share_is_trained_after_a_round(wired: Wired) -> None:
    mine = wired.engine.predictors
    await mine.store.trainers("a replica that went away", now=time.time(), ttl=60.0)
    for job in ("a", "b", "c"):
        await mine.store.index_allocation(job, 0, "allocation", 1, [], 0, time.time())
        await mine.store.push_completed(job, "no-such-tree")
    await mine.refresh(train=True)  # two trainers: a share of two
    assert len(mine._leases) == 2
    await mine.refresh(train=True)  # the third was left a round; nobody took it
    assert mine._leases == {"a", "b", "c"}
    assert await mine.store.training_wanted() == []


async def test_a_job_starts_from_a_copy_of_the_predictor_it_names(wired: Wired) -> None:
    await train_job(wired, "previous", 1.0)
    predictors = wired.engine.predictors
    source = await predictors.get("previous")
    await train_job(wired, "next", 0.0, steps=1, predictor_from="previous")
    copy = await predictors.get("next")
    assert copy.predictor is not source.predictor
    assert copy.version > source.version  # the copy, then its own first round
    assert (await predictors.get("previous")).version == source.version  # nothing flows back
    with pytest.raises(UnknownPredictorError, match="no-such-job"):
        await predictors.get("fresh", warm_from="no-such-job")
    assert (await predictors.get("fresh")).version == 0


async def test_deleting_a_job_takes_its_predictor_from_every_replica(wired: Wired) -> None:
    await train_job(wired, "doomed", 1.0)
    await train_job(wired, "kept", 0.0, steps=1)
    other = replica_of(wired)
    assert (await other.get("doomed")).version >= 1
    deleted = await wired.engine.jobs.delete("doomed")
    assert deleted.keys_deleted > 0
    keys = [key async for key in wired.store.redis.scan_iter(match=f"{wired.store.keys.prefix}:*")]
    assert not [key for key in keys if b"{j:doomed}" in key]
    assert (await wired.engine.predictors.get("doomed")).version == 0
    await other.refresh(train=True)
    assert "doomed" not in other._resident and "kept" in {*other._resident, *await other.store.jobs()}
    keys = [key async for key in wired.store.redis.scan_iter(match=f"{wired.store.keys.prefix}:*")]
    assert not [key for key in keys if b"{j:doomed}" in key]  # nothing was written back
    assert wired.sample("trace_predictor_version", {"training_job": "doomed"}) == 0
    assert (await wired.engine.predictors.get("kept")).version >= 1


async def test_closing_sets_down_what_this_replica_trains(wired: Wired) -> None:
    await train_job(wired, "job", 1.0, steps=2)
    trained = await wired.engine.predictors.get("job")
    await wired.engine.predictors.close(seconds=30.0)
    restarted = replica_of(wired)
    loaded = await restarted.get("job")
    assert loaded.version == trained.version
    assert len(loaded.predictor._replay) == len(trained.predictor._replay) > 0


async def test_a_job_not_set_down_in_time_has_its_trees_queued_again(
    wired: Wired, monkeypatch: pytest.MonkeyPatch
) -> None:
    await train_job(wired, "job", 1.0, steps=2)
    learned = list((await wired.engine.predictors.get("job")).unsaved)
    assert learned and await wired.store.training_wanted() == []

    async def stuck(job: str, blob: bytes) -> bool:
        await asyncio.Event().wait()  # a store that never answers in time
        return True

    monkeypatch.setattr(wired.store, "save_predictor", stuck)
    began = time.monotonic()
    await wired.engine.predictors.close(seconds=0.2)
    assert time.monotonic() - began < 10  # the deadline holds (far above 0.2 s on a busy machine)
    assert await wired.store.training_wanted() == ["job"]
    assert sorted(await wired.store.pop_completed("job", 10_000)) == sorted(learned)


async def test_predictors_beyond_the_memory_budget_are_set_down(wired: Wired) -> None:
    predictors = wired.engine.predictors
    await train_job(wired, "first", 1.0, steps=1)
    held = (await predictors.get("first")).memory_bytes
    assert held > 0
    assert wired.sample("trace_predictor_bytes", {"training_job": "first", "kind": "memory"}) == held
    predictors.memory_budget = held + 1  # room for one job's predictor, not two
    await train_job(wired, "second", 1.0, steps=1)
    assert list(predictors._resident) == ["second"]  # the least recently used is set down
    await asyncio.gather(*predictors._setting_down.values())
    assert await wired.store.load_predictor("first") is not None
    assert wired.sample("trace_predictor_bytes", {"training_job": "first", "kind": "set_down"}) > 0
