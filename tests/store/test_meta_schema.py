"""One schema for a tree's meta hash: every field a store script reads or writes in it is one that
`trace_service.store.records` declares (what a tree is created with, what TreeMeta reads, the prompt
text, or a script-only claim field), so a field renamed on one side cannot silently read as absent."""

from __future__ import annotations

import re
from pathlib import Path

from trace_service.store.records import TreeMeta

SCRIPTS = Path(__file__).resolve().parents[2] / "service" / "trace_service" / "store" / "scripts"
DECLARED = {*TreeMeta.FIELDS, *TreeMeta.SCRIPT_FIELDS, "prompt"}
#: A command on the meta hash (`meta_key` or the sweeper's `key` over tree metas), with its fields.
META_CALL = re.compile(r"redis\.call\('(?:HMGET|HGET|HSET|HINCRBY)', (?:meta_key|key), ([^)]*)\)", re.S)


def meta_fields(source: str) -> set[str]:
    fields = set()
    for call in META_CALL.finditer(source):
        fields |= set(re.findall(r"'([a-z_]+)'", call.group(1)))
    listed = re.search(r"local fields = \{([^}]*)\}", source)  # apply_events' HMGET list
    if listed:
        fields |= set(re.findall(r"'([a-z_]+)'", listed.group(1)))
    return fields


def test_every_meta_field_a_script_names_is_declared() -> None:
    named = {
        script.name: meta_fields(script.read_text())
        for script in sorted(SCRIPTS.glob("*.lua"))
        if script.name not in ("commit_draw.lua", "create_reserve.lua", "record_outcome.lua")
    }
    assert named["apply_events.lua"] and named["commit_decision.lua"]  # the parse found the fields
    for script, fields in named.items():
        assert fields <= DECLARED, f"{script} names meta fields no record declares: {fields - DECLARED}"
