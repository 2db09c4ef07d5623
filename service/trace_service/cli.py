"""The ``trace-rollout`` command: ``serve`` the API, ``demo`` the method on a simulated workload,
``openapi`` to write (or check) the committed OpenAPI document."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

#: The committed OpenAPI document, relative to the repository root (also baked into the image).
OPENAPI_PATH = Path("proto") / "openapi.v1.json"


def openapi_text() -> str:
    from trace_service.app import create_app

    return json.dumps(create_app().openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def _serve(args: argparse.Namespace) -> int:
    import uvicorn

    from trace_service.app import create_app
    from trace_service.settings import Settings

    overrides = {"store_url": args.store_url} if args.store_url is not None else {}
    settings = Settings(**overrides)
    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_level=settings.log_level.lower(),
        proxy_headers=True,
        timeout_graceful_shutdown=20,
    )
    return 0


def _demo(args: argparse.Namespace) -> int:
    from trace_service import demo

    demo.run(demo.config_from_arguments(args))
    return 0


def _openapi(args: argparse.Namespace) -> int:
    text = openapi_text()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            print(f"{args.out} is out of date: run `trace-rollout openapi`", file=sys.stderr)
            return 1
        return 0
    args.out.write_text(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="trace-rollout", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the HTTP service")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8000)
    serve.add_argument(
        "--store-url",
        default=None,
        help="redis://host:port/db; empty or unset: the embedded store (TRACE_STORE_URL)",
    )
    serve.set_defaults(run=_serve)

    from trace_service.demo import add_arguments as add_demo_arguments

    demo = commands.add_parser(
        "demo", help="TRACE against uniform allocation on a simulated workload: a table and a plot"
    )
    add_demo_arguments(demo)
    demo.set_defaults(run=_demo)

    openapi = commands.add_parser("openapi", help="write the OpenAPI document")
    openapi.add_argument("--out", type=Path, default=OPENAPI_PATH)
    openapi.add_argument("--check", action="store_true", help="exit 1 if the committed document is stale")
    openapi.set_defaults(run=_openapi)

    args = parser.parse_args(argv)
    return int(args.run(args))


if __name__ == "__main__":
    sys.exit(main())
