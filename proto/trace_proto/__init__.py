"""trace_proto: the wire contract of trace-rollout (pydantic v2 models; imports nothing but pydantic).

The current version is re-exported here; import from `trace_proto.v1` to pin it explicitly.
"""

from trace_proto.v1 import *  # noqa: F403
from trace_proto.v1 import __all__ as __all__
