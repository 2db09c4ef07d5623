"""Large bodies are read in parts (their structure in linear time, then element by element): the same
answers as validating the whole body, on every valid and hostile body of the hostile-input suite, and
the structure read exactly as a JSON parser reads it."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import BaseModel, ValidationError
from test_hostile_inputs import allocate_inputs, event_inputs, other_inputs, raw

from trace_proto import AllocateRequest, ExpandRequest, PredictRequest
from trace_proto.v1 import limits
from trace_service.parsing.body import BodyErrors, validate_in_parts
from trace_service.parsing.structure import Structure, TooManyElements

ARRAYS: dict[str, tuple[type[BaseModel], str]] = {
    "/v1/allocate": (AllocateRequest, "prompts"),
    "/v1/predict": (PredictRequest, "histories"),
    "/v1/expand": (ExpandRequest, "events"),
}
TWO_PROMPTS = [{"prompt_id": "p"}, {"prompt_id": "q"}]
VALID: list[tuple[str, Any]] = [
    ("/v1/allocate", {"step": 0, "budget": 4, "prompts": [{"prompt_id": "p", "features": [1.0]}]}),
    ("/v1/allocate", {"budget": 4.0, "step": 3, "expansion": 1, "prompts": TWO_PROMPTS}),
    (
        "/v1/allocate",
        {"step": 0, "budget": 4, "policy": "uniform", "max_prompts": None, "prompts": TWO_PROMPTS},
    ),
    ("/v1/predict", {"job": "j", "histories": [{"prompt_id": "p", "turns": [{"text": "a"}]}]}),
    ("/v1/expand", {"events": [{"event_id": "e", "tree_id": "t", "node_id": "n", "text": '\\"'}]}),
]


def outcome(body: bytes, model: type[BaseModel], name: str, *, parts: bool) -> Any:
    """The validated request as a dict, or its errors' sorted types and locations."""
    try:
        request = validate_in_parts(body, model, name) if parts else model.model_validate_json(body)
    except (ValidationError, BodyErrors) as error:
        return sorted(f"{e['type']} {e['loc']}" for e in error.errors())
    return request.model_dump()


@pytest.mark.parametrize(("path", "value"), VALID)
def test_valid_bodies_read_in_parts_as_whole(path: str, value: Any) -> None:
    model, name = ARRAYS[path]
    body = raw(value)
    assert outcome(body, model, name, parts=True) == outcome(body, model, name, parts=False)
    assert isinstance(outcome(body, model, name, parts=True), dict)


def hostile_bodies() -> list[tuple[str, bytes]]:
    cases = [*allocate_inputs(), *event_inputs("t"), *other_inputs()]
    bodies = [(case.path, case.body if isinstance(case.body, bytes) else raw(case.body)) for case in cases]
    return [(path, body) for path, body in bodies if path in ARRAYS and len(body) <= 1 << 20]


def readable(body: bytes, name: str) -> bool:
    """The body is one object whose member ``name`` is an array: its parts can be read."""
    structure = Structure(body)
    members = structure.object_members()
    key = f'"{name}"'.encode()
    if members is None or key not in members:
        return False
    try:
        return structure.array_elements(members[key], 1 << 30) is not None
    except TooManyElements:
        return False


@pytest.mark.parametrize(("path", "body"), hostile_bodies())
def test_hostile_bodies_refused_in_parts_as_whole(path: str, body: bytes) -> None:
    """Every body the whole-body validation refuses is refused in parts; where its parts can be read,
    with the same errors at the same locations (JSON that does not parse is located more closely in
    parts: at the element that holds it)."""
    model, name = ARRAYS[path]
    whole = outcome(body, model, name, parts=False)
    in_parts = outcome(body, model, name, parts=True)
    if isinstance(whole, dict):
        assert in_parts == whole
        return
    assert isinstance(in_parts, list), f"refused whole ({whole}), accepted in parts"
    if readable(body, name) and not any(error.startswith("json_invalid") for error in whole):
        assert in_parts == whole


def test_too_many_elements_are_counted_without_reading_them() -> None:
    body = b'{"events":[' + b"," * (limits.MAX_EVENTS_PER_REQUEST + 5) + b"]}"
    structure = Structure(body)
    members = structure.object_members()
    assert members is not None
    with pytest.raises(TooManyElements) as error:
        structure.array_elements(members[b'"events"'], limits.MAX_EVENTS_PER_REQUEST)
    assert error.value.count == limits.MAX_EVENTS_PER_REQUEST + 6


@pytest.mark.parametrize(
    "body",
    [
        b'{"events":["' + b'\\"' * 1000,  # a string that never closes
        b'{"events":[' + b'"' * 1001,
        b'{"events":[' + b"[" * 1000 + b"]}",  # never closed
        b'{"events":[1]}x',
        b'["events"]',
        b'{"events" "x":[1]}',
        b'{"a":1,"a":2}',
        b"",
    ],
)
def test_bodies_of_no_readable_structure(body: bytes) -> None:
    assert Structure(body).object_members() is None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text(alphabet='\\"[]{},: ab\n'),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=4), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(
    st.dictionaries(
        st.text(alphabet='\\"[]{},: ab', max_size=6), st.lists(json_values, max_size=5), max_size=4
    ),
    st.booleans(),
)
def test_structure_reads_as_a_json_parser(document: dict[str, list[Any]], spaced: bool) -> None:
    """Against the exact reference, the standard library's parser: the members and the elements of
    each array member are the parser's."""
    body = json.dumps(document, indent=1 if spaced else None).encode()
    structure = Structure(body)
    members = structure.object_members()
    assert members is not None
    assert {json.loads(key): json.loads(body[start:end]) for key, (start, end) in members.items()} == document
    for key, span in members.items():
        spans = structure.array_elements(span, limit=100)
        assert spans is not None
        assert [json.loads(body[start:end]) for start, end in spans] == document[json.loads(key)]
