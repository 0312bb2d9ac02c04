"""What every benchmark does with its result: print it as JSON, and write
it to ``--out`` when given (the files in benchmarks/results/)."""
from __future__ import annotations

import json
from typing import Optional


def emit(result: dict, out: Optional[str]) -> dict:
    """Print ``result`` as indented JSON; also write it to ``out`` if set."""
    text = json.dumps(result, indent=2)
    print(text)
    if out:
        with open(out, "w") as fh:
            fh.write(text + "\n")
    return result
