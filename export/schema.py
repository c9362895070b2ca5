"""`python -m export.schema`: print the JSON Schema of a `steps.jsonl` line.

A reader of an export (a training pipeline, a validator in another language) wants the schema
without a zip at hand, and `docs/export/step.schema.json` is regenerated from this output
(`python -m export.schema > docs/export/step.schema.json`; a test fails when the two differ).
`--v1`, `--v2` and `--v3` print the closed `amc.export.step/1`, `/2` and `/3` schemas
(`docs/export/step-v1.schema.json`, `step-v2.schema.json`, `step-v3.schema.json`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from export import dataset


def main(argv: Sequence[str] | None = None) -> int:
    """Write the schema to stdout byte for byte as the docs hold it (no extra newline)."""
    parser = argparse.ArgumentParser(
        prog="python -m export.schema",
        description="Print the JSON Schema of one line of an export's steps.jsonl.",
    )
    closed = parser.add_mutually_exclusive_group()
    closed.add_argument(
        "--v1",
        action="store_true",
        help="the closed amc.export.step/1 schema instead of the current amc.export.step/4",
    )
    closed.add_argument(
        "--v3",
        action="store_true",
        help="the closed amc.export.step/3 schema instead of the current amc.export.step/4",
    )
    closed.add_argument(
        "--v2",
        action="store_true",
        help="the closed amc.export.step/2 schema instead of the current amc.export.step/4",
    )
    args = parser.parse_args(argv)
    record: type[dataset.StepRecordV1] = dataset.StepRecord
    if args.v1:
        record = dataset.StepRecordV1
    elif args.v2:
        record = dataset.StepRecordV2
    elif args.v3:
        record = dataset.StepRecordV3
    sys.stdout.write(dataset.schema_json(record))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
