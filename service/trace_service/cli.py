"""The `trace-rollout` command: `serve` the API, `openapi` to write (or check) the committed OpenAPI
document. (The demo is the client's: `trace-rollout-demo`.)

A failure the user can act on (an invalid setting or option, a service that cannot be reached) is one
line on stderr, `trace-rollout COMMAND: error: ...`, with exit status 2 for bad input (as argparse's
own errors) and 1 for the rest; never a traceback.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
import time
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from trace_service import __version__

if TYPE_CHECKING:
    from pydantic import ValidationError

#: The committed OpenAPI document, relative to the repository root (also baked into the image).
OPENAPI_PATH = Path("proto") / "openapi.v1.json"
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8000
#: Exit status of a usage error: an invalid option or setting.
USAGE_ERROR = 2
#: `serve --help` prints its settings as they are (argparse would join the lines); wrapped to this.
_HELP_WIDTH = 79


class CommandError(Exception):
    """A failure reported in one line, without a traceback; the command exits with `status`."""

    def __init__(self, message: str, status: int = 1) -> None:
        super().__init__(message)
        self.status = status


def openapi_text() -> str:
    from trace_service.app import create_app

    return json.dumps(create_app().openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def settings_error(error: ValidationError, flags: Mapping[str, str]) -> CommandError:
    """Each invalid setting named as the user set it: its `--flag` or its `TRACE_` variable. Values are
    not repeated (a store URL or token may carry a secret)."""
    from trace_service.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    problems = []
    for item in error.errors():
        field = str(item["loc"][0]) if item["loc"] else None
        name = "settings" if field is None else flags.get(field, f"{prefix}{field.upper()}")
        problems.append(f"{name}: {item['msg']}")
    noun = "setting" if len(problems) == 1 else "settings"
    return CommandError(f"invalid {noun} {'; '.join(problems)}", USAGE_ERROR)


def port_number(text: str) -> int:
    """`--port`: a TCP port, 1-65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a port number (1-65535)")
    return port


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from trace_service.settings import Settings

    overrides = {"store_url": args.store_url} if args.store_url is not None else {}
    try:
        settings = Settings(**overrides)
    except ValidationError as error:
        raise settings_error(error, {"store_url": "--store-url"}) from None
    if "metrics_host" not in settings.model_fields_set:  # the metrics port listens where the API does
        settings = settings.model_copy(update={"metrics_host": args.host})
    if settings.store_url:
        _wait_for_store(settings.store_url, settings.store_cluster, settings.store_connect_seconds)

    import uvicorn

    from trace_service.app import create_app
    from trace_service.logs import logging_config

    uvicorn.run(
        create_app(settings),
        host=args.host,
        port=args.port,
        log_config=logging_config(settings.log_level, settings.log_format),
        proxy_headers=True,
        timeout_graceful_shutdown=20,
    )
    return 0


def _wait_for_store(url: str, cluster: bool, seconds: float) -> None:
    """Return once the store at ``url`` answers a PING; a URL that names no store, or a store that does
    not answer within ``seconds``, is a :class:`CommandError` (one line), not a service that retries
    forever in its logs."""
    from redis import Redis, RedisCluster
    from redis.exceptions import RedisError

    shown = _without_password(url)
    deadline = time.monotonic() + seconds
    try:
        kind = RedisCluster if cluster else Redis
        client = kind.from_url(url, socket_connect_timeout=2, socket_timeout=2)
    except ValueError as error:
        raise CommandError(f"invalid store URL {shown!r}: {error}", USAGE_ERROR) from None
    pause = 0.25
    while True:
        try:
            client.ping()
            client.close()  # the service opens its own connections
            return
        except (RedisError, OSError) as error:
            if time.monotonic() + pause > deadline:
                raise CommandError(
                    f"the store at {shown} did not answer within {seconds:g} s "
                    f"(TRACE_STORE_CONNECT_SECONDS): {error}"
                ) from None
        time.sleep(pause)
        pause = min(2 * pause, 5.0)


def _without_password(url: str) -> str:
    """The URL as logs may show it: a password replaced by ***."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def _openapi(args: argparse.Namespace) -> int:
    text = openapi_text()
    if args.check:
        if not args.out.exists() or args.out.read_text() != text:
            raise CommandError(f"{args.out} is out of date: run `trace-rollout openapi`")
        return 0
    args.out.write_text(text)
    return 0


def _settings_epilog() -> str:
    """The environment settings `serve` reads, with their defaults, from `Settings` itself."""
    from trace_service.settings import Settings

    prefix = Settings.model_config.get("env_prefix", "")
    lines = ["settings, from the environment (default in parentheses):"]
    for name, field in Settings.model_fields.items():
        default = field.get_default(call_default_factory=True)
        shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
        description = f"{field.description} " if field.description else ""
        entry = f"{prefix}{name.upper()}: {description}({shown or 'empty'})"
        lines.append(textwrap.fill(entry, _HELP_WIDTH, initial_indent="  ", subsequent_indent="      "))
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trace-rollout",
        description="TRACE rollout allocation as a service: run the HTTP API or write the OpenAPI document.",
        epilog="`trace-rollout COMMAND --help` shows each command's options; the demo is "
        "`trace-rollout-demo`.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    serve = commands.add_parser(
        "serve",
        help="run the HTTP service",
        description=textwrap.fill(
            "Run the v1 HTTP API. Settings come from TRACE_* environment variables; an invalid one stops "
            "the start with one line naming it.",
            _HELP_WIDTH,
        ),
        epilog=_settings_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    serve.add_argument("--host", default=DEFAULT_HOST, help=f"interface to listen on ({DEFAULT_HOST})")
    serve.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help=f"port to listen on ({DEFAULT_PORT})"
    )
    serve.add_argument(
        "--store-url",
        default=None,
        help="redis://host:port/db; empty: the embedded store (default: TRACE_STORE_URL, else empty)",
    )
    serve.set_defaults(run=_serve)

    openapi = commands.add_parser(
        "openapi",
        help="write the OpenAPI document",
        description="Write the service's OpenAPI document, or check that the committed one is current.",
    )
    openapi.add_argument("--out", type=Path, default=OPENAPI_PATH, help=f"where to write it ({OPENAPI_PATH})")
    openapi.add_argument("--check", action="store_true", help="exit 1 if the document there is stale")
    openapi.set_defaults(run=_openapi)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return int(args.run(args))
    except CommandError as error:
        print(f"trace-rollout {args.command}: error: {error}", file=sys.stderr)
        return error.status


if __name__ == "__main__":
    sys.exit(main())
