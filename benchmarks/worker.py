"""Child process of a compile sweep: ``python -m benchmarks.worker '<json request>'``."""

import json
import sys

from .measure import run_worker

run_worker(json.loads(sys.argv[1]))
