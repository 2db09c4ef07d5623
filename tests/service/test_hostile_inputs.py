"""A hostile client's inputs, on both stores: every one gets a clean 4xx (a problem+json answer, or for
an event of /v1/expand its own 4xx in `rejected`), nothing is recorded by them, budgets stay whole."""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from support import make_settings

from trace_lab.local import ThreadedService
from trace_proto.v1 import limits

#: Values no integer field of the contract takes.
BAD_INTEGERS: list[Any] = ["5", True, -1, 1.5, 2**64, 10**400, [], {}, "NaN"]
BAD_FLOATS: list[Any] = ["2", True, -1.0, 1e999, -1e999, [], {}]
BAD_IDS: list[Any] = ["", "x" * (limits.MAX_ID_LENGTH + 1), 5, None, [], "\ud800"]
BAD_FEATURES: list[Any] = ["0.5", [True], ["0.5"], [[0.5]], [math.nan], [], [1e39], {}]


@dataclass
class Hostile:
    """One bad request: what it is, and how to send it."""

    name: str
    method: str
    path: str
    body: Any = None  # JSON-serialisable, or bytes sent as they are
    headers: dict[str, str] = field(default_factory=dict)
    per_event: bool = False  # /v1/expand answers 200 and rejects the event alone


def raw(value: Any) -> bytes:
    """JSON text for ``value``, lone surrogates and non-finite numbers included (as a hostile client
    would write them)."""
    return json.dumps(value, allow_nan=True).replace("Infinity", "1e999").encode()


def allocate_inputs() -> Iterator[Hostile]:
    valid: dict[str, Any] = {"step": 0, "budget": 4, "prompts": [{"prompt_id": "p"}, {"prompt_id": "q"}]}
    integers = ("step", "budget", "min_rollouts", "max_rollouts", "rounds", "max_prompts", "max_branch_depth")
    for name in integers:
        for value in BAD_INTEGERS:
            yield Hostile(f"allocate {name}={value!r:.20}", "POST", "/v1/allocate", {**valid, name: value})
    for value in [0, 1025]:  # a first turn is depth 1; no history holds more than 1,024 turns
        body = {**valid, "max_branch_depth": value}
        yield Hostile(f"allocate max_branch_depth={value}", "POST", "/v1/allocate", body)
    for value in [*BAD_FLOATS, 65.0, None]:
        yield Hostile(f"allocate expansion={value!r}", "POST", "/v1/allocate", {**valid, "expansion": value})
    for value in [*BAD_FLOATS, -0.01, 1.01, None, "0.1"]:
        body = {**valid, "control_share": value}
        yield Hostile(f"allocate control_share={value!r}", "POST", "/v1/allocate", body)
    for value in ["", "a b", "x" * 200, "é", None, 5]:
        yield Hostile(f"allocate job={value!r:.20}", "POST", "/v1/allocate", {**valid, "job": value})
    for value in ["TRACE", "", None, 1]:
        yield Hostile(f"allocate policy={value!r}", "POST", "/v1/allocate", {**valid, "policy": value})
    for value in [1, "yes", None]:
        yield Hostile(
            f"allocate return_unspent={value!r}", "POST", "/v1/allocate", {**valid, "return_unspent": value}
        )
    prompts: list[tuple[str, Any]] = [
        ("no prompts", []),
        ("prompts not a list", {"prompt_id": "p"}),
        ("too many prompts", [{"prompt_id": f"p{i}"} for i in range(limits.MAX_PROMPTS_PER_REQUEST + 1)]),
        ("repeated prompt_id", [{"prompt_id": "p"}, {"prompt_id": "p"}]),
        ("prompt text too long", [{"prompt_id": "p", "text": "x" * (limits.MAX_TEXT_LENGTH + 1)}]),
        ("prompt features on a server without", [{"prompt_id": "p", "features": [0.5]}]),
        (
            "prompt features of two lengths",
            [{"prompt_id": "p", "features": [1.0]}, {"prompt_id": "q", "features": [1.0, 2.0]}],
        ),
        ("prompt metadata NaN", [{"prompt_id": "p", "metadata": {"m": math.nan}}]),
        ("prompt metadata infinite", [{"prompt_id": "p", "metadata": {"m": [1, {"n": math.inf}]}}]),
        ("prompt unknown field", [{"prompt_id": "p", "weight": 1}]),
        ("prompt not an object", ["p"]),
    ]
    prompts += [(f"prompt_id={value!r:.20}", [{"prompt_id": value}]) for value in BAD_IDS]
    prompts += [
        (f"prompt features={value!r:.20}", [{"prompt_id": "p", "features": value}]) for value in BAD_FEATURES
    ]
    prompts += [
        (f"prompt text={value!r:.20}", [{"prompt_id": "p", "text": value}]) for value in [5, [], {}, "\ud800"]
    ]
    for name, value in prompts:
        yield Hostile(f"allocate {name}", "POST", "/v1/allocate", {**valid, "prompts": value})
    yield Hostile(
        "allocate min above max", "POST", "/v1/allocate", {**valid, "min_rollouts": 8, "max_rollouts": 4}
    )
    yield Hostile("allocate unknown field", "POST", "/v1/allocate", {**valid, "budgte": 4})
    yield Hostile(
        "allocate idempotency key too long", "POST", "/v1/allocate", valid, {"Idempotency-Key": "k" * 300}
    )
    yield Hostile("allocate no body", "POST", "/v1/allocate", b"")
    yield Hostile("allocate not JSON", "POST", "/v1/allocate", b"{step: 0")
    yield Hostile("allocate array body", "POST", "/v1/allocate", [valid])
    yield Hostile(
        "allocate deep metadata",
        "POST",
        "/v1/allocate",
        b'{"step": 0, "budget": 2, "prompts": [{"prompt_id": "p", "metadata": {"m": '
        + b"[" * 3000
        + b"]" * 3000
        + b"}}]}",
    )


#: The valid event sent beside each bad one: the next turn of one long rollout (``tally`` names it).
VALID_EVENT = {"event_id": "@ok", "node_id": "@ok", "parent_id": "@previous"}


def event_inputs(tree_id: str) -> Iterator[Hostile]:
    """Bad events, each sent beside a valid one: the valid one is applied, the bad one rejected alone."""
    base: dict[str, Any] = {"event_id": "bad", "tree_id": tree_id, "node_id": "bad"}
    changes: list[tuple[str, dict[str, Any]]] = [
        (f"{name}={value!r:.20}", {name: value}) for name in ("event_id", "node_id") for value in BAD_IDS
    ]
    changes += [(f"parent_id={value!r:.20}", {"parent_id": value}) for value in BAD_IDS if value is not None]
    changes += [(f"tree_id={value!r:.20}", {"tree_id": value}) for value in BAD_IDS]
    changes += [
        (f"instruction_id={value!r:.20}", {"instruction_id": value}) for value in BAD_IDS if value is not None
    ]
    changes += [(f"features={value!r:.20}", {"features": value}) for value in BAD_FEATURES]
    changes += [(f"text={value!r:.20}", {"text": value}) for value in [5, {}, "\ud800"]]
    changes += [(f"done={value!r}", {"done": value, "reward": 1.0}) for value in [5, "true", None, []]]
    changes += [
        (f"reward={value!r}", {"done": True, "reward": value}) for value in BAD_FLOATS if value != -1.0
    ]
    changes += [
        ("done without reward", {"done": True}),
        ("reward without done", {"reward": 1.0}),
        ("own parent", {"parent_id": "bad"}),
        ("unknown parent", {"parent_id": "nobody"}),
        ("unknown tree", {"tree_id": "no-such-tree"}),
        ("unknown instruction", {"parent_id": "@ok", "instruction_id": "nope"}),
        ("continuation from the prompt", {"instruction_id": "nope"}),
        ("text too long", {"text": "x" * (limits.MAX_TEXT_LENGTH + 1)}),
        ("text not a string", {"text": ["a"]}),
        ("text nested 3,000 deep", {"text": "DEEP"}),
        ("features on a server without", {"features": [0.5, 0.25]}),
        ("features NaN", {"features": [math.nan]}),
        ("features too long", {"features": [0.0] * (limits.MAX_FEATURE_DIM + 1)}),
        ("unknown field", {"colour": "red"}),
        ("node_id reused with other text", {"node_id": "@ok", "event_id": "again", "text": "other"}),
    ]
    for name, change in changes:
        body = raw({"events": [{**VALID_EVENT, "tree_id": tree_id}, {**base, **change}]})
        body = body.replace(b'"DEEP"', b"[" * 3000 + b"]" * 3000)
        yield Hostile(f"expand event {name}", "POST", "/v1/expand", body, per_event=True)
    bodies = [
        ("not an object", b"[]"),
        ("events not a list", b'{"events": {}}'),
        ("no events", b'{"events": []}'),
        ("extra key", b'{"events": [{}], "more": 1}'),
        ("not JSON", b"{events"),
        ("invalid UTF-8", b"\xff\xfe"),
        ("unterminated deep nest", b'{"events": [' + b"[" * 3000),
    ]
    for name, value in bodies:
        yield Hostile(f"expand body {name}", "POST", "/v1/expand", value)
    many = [
        {"event_id": f"e{i}", "tree_id": tree_id, "node_id": f"n{i}"}
        for i in range(limits.MAX_EVENTS_PER_REQUEST + 1)
    ]
    yield Hostile("expand too many events", "POST", "/v1/expand", {"events": many})


def other_inputs() -> Iterator[Hostile]:
    for query in [
        "max=0",
        f"max={limits.MAX_CLAIM + 1}",
        "max=abc",
        "max=1e3",
        "job=a%20b",
        "job=",
        "maxx=5",
        "max=" + "9" * 400,
    ]:
        yield Hostile(f"instructions ?{query:.30}", "GET", f"/v1/instructions?{query}")
    yield Hostile("tree unknown", "GET", "/v1/trees/no-such-tree")
    yield Hostile("tree id too long", "GET", "/v1/trees/" + "x" * (limits.MAX_ID_LENGTH + 1))
    yield Hostile("close unknown tree", "POST", "/v1/trees/no-such-tree/close")
    yield Hostile("stats unknown job", "GET", "/v1/jobs/nobody/stats")
    yield Hostile("stats bad job name", "GET", "/v1/jobs/a%20b/stats")
    yield Hostile("stats unknown parameter", "GET", "/v1/jobs/default/stats?step=1")
    for query in [
        "from_step=-1",
        "from_step=abc",
        "to_step=1e3",
        "from_step=5&to_step=2",
        "to_step=" + "9" * 40,
    ]:
        yield Hostile(f"stats ?{query:.30}", "GET", f"/v1/jobs/default/stats?{query}")
    histories: list[tuple[str, Any]] = [
        ("no histories", []),
        ("too many histories", [{"prompt_id": "p"}] * (limits.MAX_HISTORIES_PER_REQUEST + 1)),
        ("too many turns in one", [{"prompt_id": "p", "turns": [{}] * (limits.MAX_TURNS_PER_HISTORY + 1)}]),
        ("too many turns in all", [{"prompt_id": f"p{i}", "turns": [{}] * 1024} for i in range(17)]),
        ("features on a server without", [{"prompt_id": "p", "prompt_features": [1.0]}]),
        ("turn features NaN", [{"prompt_id": "p", "turns": [{"features": [math.nan]}]}]),
        ("turn text not a string", [{"prompt_id": "p", "turns": [{"text": 5}]}]),
        ("prompt_id missing", [{}]),
    ]
    for name, value in histories:
        yield Hostile(f"predict {name}", "POST", "/v1/predict", {"histories": value})
    yield Hostile("predict bad job", "POST", "/v1/predict", {"job": "a b", "histories": [{"prompt_id": "p"}]})
    yield Hostile("body over the size limit", "POST", "/v1/allocate", b"x" * (2 << 20))
    yield Hostile("unknown route", "GET", "/v1/nothing")
    yield Hostile("wrong method", "DELETE", "/v1/allocate")


def send(client: httpx.Client, hostile: Hostile) -> httpx.Response:
    content = (
        hostile.body
        if isinstance(hostile.body, bytes)
        else (None if hostile.body is None else raw(hostile.body))
    )
    headers = {"content-type": "application/json", **hostile.headers}
    return client.request(hostile.method, hostile.path, content=content, headers=headers)


def verdict(hostile: Hostile, answer: httpx.Response) -> str | None:
    """None for a clean answer, else what was wrong with it."""
    if hostile.per_event:
        if answer.status_code != 200:
            return f"{answer.status_code}: {answer.text[:200]}"
        body = answer.json()
        statuses = [r["status"] for r in body["rejected"]]
        if body["accepted"] + body["duplicates"] != 1 or len(statuses) != 1 or not 400 <= statuses[0] < 500:
            return f"not rejected alone: {answer.text[:300]}"
        return None
    if not 400 <= answer.status_code < 500:
        return f"{answer.status_code}: {answer.text[:200]}"
    if not answer.headers.get("content-type", "").startswith("application/problem+json"):
        return f"{answer.status_code} without a problem body: {answer.text[:200]}"
    if not answer.json().get("detail"):
        return "no message"
    return None


def tally(client: httpx.Client) -> tuple[int, list[str]]:
    """Send every hostile input; how many were sent, and what was wrong with the unclean answers."""
    allocation = client.post(
        "/v1/allocate", json={"step": 0, "budget": 2, "expansion": 1.0, "prompts": [{"prompt_id": "target"}]}
    ).json()
    tree_id = allocation["trees"][0]["tree_id"]
    started = client.post(
        "/v1/expand", json={"events": [{"event_id": "t0", "tree_id": tree_id, "node_id": "t0"}]}
    )
    assert started.json()["accepted"] == 1
    inputs = [*allocate_inputs(), *event_inputs(tree_id), *other_inputs()]
    problems = []
    previous = "t0"
    for index, hostile in enumerate(inputs):
        if hostile.per_event:  # the valid event is the rollout's next turn
            body = hostile.body.replace(b"@ok", f"t{index}".encode())
            hostile.body = body.replace(b"@previous", previous.encode())
            previous = f"t{index}"
        problem = verdict(hostile, send(client, hostile))
        if problem:
            problems.append(f"{hostile.name}: {problem}")
    return len(inputs), problems


@pytest.fixture
def small_body_service(store_url: str) -> Iterator[ThreadedService]:
    with ThreadedService.from_settings(make_settings(store_url, max_body_bytes=1 << 20)) as live:
        yield live


def test_every_hostile_input_gets_a_clean_4xx(small_body_service: ThreadedService) -> None:
    with httpx.Client(base_url=small_body_service.url, timeout=120) as client:
        count, problems = tally(client)
        assert count > 200
        assert problems == []
        # Nothing they sent was recorded beyond the valid events beside them; the budget is whole.
        stats = client.get("/v1/jobs/default/stats").json()["steps"][0]
        assert stats["rollouts_spent"] <= stats["budget_promised"] == 2
