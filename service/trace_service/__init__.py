"""trace-rollout service: allocation algorithms, predictor, tree store and the HTTP API."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("trace-rollout")
except PackageNotFoundError:  # running from a source tree that was never installed
    __version__ = "0.0.0"
