"""`python -m trace_client.demo`: the same command as `trace-rollout-demo`."""

import sys

from trace_client.demo.cli import main

sys.exit(main())
