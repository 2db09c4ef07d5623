"""`python -m trace_lab.demo`: the same command as `trace-rollout-demo`."""

import sys

from trace_lab.demo.cli import main

sys.exit(main())
