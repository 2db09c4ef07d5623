"""A full store over HTTP: a new allocation gets a 503 that says why, never a 500."""

from __future__ import annotations

import time

import httpx
from support import make_settings

from trace_lab.local import ThreadedService


def test_a_full_store_answers_new_allocations_503_with_the_figures() -> None:
    prompts = [{"prompt_id": "p", "text": "solve it"}]
    with ThreadedService.from_settings(make_settings(store_max_bytes=1)) as live:
        url = f"{live.url}/v1/allocate"
        deadline = time.monotonic() + 60
        step = 0
        answer = httpx.post(url, json={"step": step, "budget": 4, "prompts": prompts}, timeout=30)
        while answer.status_code == 200 and time.monotonic() < deadline:  # until the store is measured
            step += 1
            answer = httpx.post(url, json={"step": step, "budget": 4, "prompts": prompts}, timeout=30)
    assert answer.status_code == 503
    assert "the tree store is full" in answer.json()["detail"]
    assert answer.headers["Retry-After"] == "60"
