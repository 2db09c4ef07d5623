"""Write the JSON Schema of every v1 body to `proto/schemas/`, or check the committed ones.

    python -m trace_proto.export            # (re)write the schemas
    python -m trace_proto.export --check    # exit 1 if the committed schemas differ from the models

Requests are exported in validation mode (what the server accepts), responses in serialization mode
(what the server sends, computed fields included). The output is stable: sorted keys, two-space
indent, one trailing newline, so a diff shows only real contract changes.
"""

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pydantic.json_schema import JsonSchemaMode

from trace_proto.v1 import API_VERSION, SCHEMA_MODELS, RequestModel, ResponseModel

DEFAULT_SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"
SCHEMA_SUFFIX = f".{API_VERSION}.schema.json"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"


def schema_file_name(model: type[RequestModel] | type[ResponseModel]) -> str:
    """`AllocateRequest` → `allocate-request.v1.schema.json`."""
    kebab = "".join(f"-{char.lower()}" if char.isupper() else char for char in model.__name__).lstrip("-")
    return kebab + SCHEMA_SUFFIX


def render_schema(model: type[RequestModel] | type[ResponseModel]) -> str:
    """The model's JSON Schema as stable text."""
    mode: JsonSchemaMode = "validation" if issubclass(model, RequestModel) else "serialization"
    schema: dict[str, Any] = {"$schema": JSON_SCHEMA_DIALECT, **model.model_json_schema(mode=mode)}
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def expected_schemas() -> dict[str, str]:
    """File name → content, for every exported model."""
    return {schema_file_name(model): render_schema(model) for model in SCHEMA_MODELS}


def drift(directory: Path, expected: dict[str, str]) -> list[str]:
    """Names of schema files that are missing, stale (no model any more) or differ from `expected`."""
    committed = (
        {path.name: path for path in directory.glob(f"*{SCHEMA_SUFFIX}")} if directory.is_dir() else {}
    )
    differing = [
        name
        for name, text in expected.items()
        if name not in committed or committed[name].read_text(encoding="utf-8") != text
    ]
    stale = [name for name in committed if name not in expected]
    return sorted(differing + stale)


def write_schemas(directory: Path) -> list[str]:
    """Write every schema and delete stale ones; returns the names that changed."""
    expected = expected_schemas()
    changed = drift(directory, expected)
    directory.mkdir(parents=True, exist_ok=True)
    for stale in directory.glob(f"*{SCHEMA_SUFFIX}"):
        if stale.name not in expected:
            stale.unlink()
    for name, text in expected.items():
        (directory / name).write_text(text, encoding="utf-8")
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m trace_proto.export", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the committed schemas are out of date"
    )
    parser.add_argument(
        "--out", type=Path, default=DEFAULT_SCHEMA_DIR, help="schema folder (default: %(default)s)"
    )
    args = parser.parse_args(argv)
    if args.check:
        drifted = drift(args.out, expected_schemas())
        if drifted:
            sys.stderr.write(
                f"JSON Schemas in {args.out} differ from trace_proto: {', '.join(drifted)}\n"
                "Run `python -m trace_proto.export` and commit the result.\n"
            )
            return 1
        return 0
    changed = write_schemas(args.out)
    sys.stderr.write(f"{len(SCHEMA_MODELS)} schemas in {args.out}; changed: {', '.join(changed) or 'none'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
