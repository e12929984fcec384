"""Both halves of how a benchmark measures in a fresh process whose `megatron` is a given checkout's: each
measurement's peak memory, imports and start-up are then its own, and this checkout and an older one (a
`--compare-root`) can take turns. The worker prints its results as JSON lines after a prefix."""
import json
import os
import subprocess
from typing import List, Mapping, Sequence

from megatron.errors import RunError


def report(prefix: str, measured: Mapping) -> None:
    """The worker's half: one result line."""
    print(prefix + json.dumps(measured), flush=True)


def run_with_root(command: Sequence[str], root: str, prefix: str, environment: Mapping[str, str] = None
                  ) -> List[dict]:
    """The benchmark's half: `command` with `root` first on PYTHONPATH (and `environment` added); the results it
    reported, in the order printed."""
    merged = {**os.environ, **(environment or {}),
              "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    result = subprocess.run(list(command), capture_output=True, text=True, env=merged)
    results = [json.loads(line[len(prefix):]) for line in result.stdout.splitlines() if line.startswith(prefix)]
    if result.returncode or not results:
        raise RunError(f"{' '.join(command)} failed (PYTHONPATH {root}, exit {result.returncode}):\n"
                       f"{result.stdout[-2000:]}\n{result.stderr[-2000:]}")
    return results
