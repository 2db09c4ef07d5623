"""The committed JSON Schemas match the models, and the drift check notices every kind of drift."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

from trace_proto import SCHEMA_MODELS, RequestModel
from trace_proto.export import DEFAULT_SCHEMA_DIR, main, schema_file_name, write_schemas


def test_committed_schemas_match_the_models() -> None:
    assert main(["--check"]) == 0, "run `python -m trace_proto.export` and commit proto/schemas/"


def test_check_runs_as_a_module() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "trace_proto.export", "--check", "--out", str(DEFAULT_SCHEMA_DIR)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr


def test_one_schema_per_model_with_stable_names() -> None:
    names = [schema_file_name(model) for model in SCHEMA_MODELS]
    assert len(set(names)) == len(SCHEMA_MODELS)
    assert "allocate-request.v1.schema.json" in names
    assert "expand-event.v1.schema.json" in names


@pytest.fixture
def schema_dir(tmp_path: Path) -> Path:
    write_schemas(tmp_path)
    assert main(["--check", "--out", str(tmp_path)]) == 0
    return tmp_path


def test_check_reports_an_edited_schema(schema_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    edited = schema_dir / "health.v1.schema.json"
    schema = json.loads(edited.read_text())
    schema["properties"]["status"]["title"] = "Changed"
    edited.write_text(json.dumps(schema, indent=2, sort_keys=True) + "\n")
    assert main(["--check", "--out", str(schema_dir)]) == 1
    assert "health.v1.schema.json" in capsys.readouterr().err


def test_check_reports_a_missing_schema(schema_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (schema_dir / "ready.v1.schema.json").unlink()
    assert main(["--check", "--out", str(schema_dir)]) == 1
    assert "ready.v1.schema.json" in capsys.readouterr().err


def test_check_reports_a_stale_schema_and_export_removes_it(schema_dir: Path) -> None:
    stale = schema_dir / "removed-model.v1.schema.json"
    stale.write_text("{}\n")
    (schema_dir / "openapi.v1.json").write_text("{}\n")  # not ours: left alone
    assert main(["--check", "--out", str(schema_dir)]) == 1
    assert write_schemas(schema_dir) == ["removed-model.v1.schema.json"]
    assert not stale.exists()
    assert (schema_dir / "openapi.v1.json").exists()
    assert main(["--check", "--out", str(schema_dir)]) == 0


def test_check_fails_without_the_folder(tmp_path: Path) -> None:
    assert main(["--check", "--out", str(tmp_path / "absent")]) == 1


def test_request_schemas_forbid_unknown_fields(schema_dir: Path) -> None:
    for model in SCHEMA_MODELS:
        schema = json.loads((schema_dir / schema_file_name(model)).read_text())
        assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
        assert (schema.get("additionalProperties") is False) == issubclass(model, RequestModel), (
            model.__name__
        )


def test_response_schemas_include_computed_fields(schema_dir: Path) -> None:
    schema = json.loads((schema_dir / "allocate-response.v1.schema.json").read_text())
    assert "unspent" in schema["properties"]
