"""The counts a generated landing zone must come to (``<root>/landing/expected_counts.json``):
what the generator promises and the audit checks (contract section 5).

Its own module, so the audit reads the file without importing the generator.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class ExpectedCounts:
    """What silver must hold once everything generated has been processed."""

    delivered: int = 0  # non-blank lines: bronze rows
    valid_distinct: int = 0  # silver rows
    duplicates: int = 0
    invalid_by_reason: Counter[str] = field(default_factory=Counter)
    blank_lines: int = 0
    files: int = 0

    @property
    def invalid(self) -> int:
        return sum(self.invalid_by_reason.values())

    def as_json(self) -> dict[str, object]:
        return {
            "delivered": self.delivered,
            "valid_distinct": self.valid_distinct,
            "invalid": self.invalid,
            "duplicates": self.duplicates,
            "invalid_by_reason": dict(sorted(self.invalid_by_reason.items())),
            "blank_lines": self.blank_lines,
            "files": self.files,
        }

    @classmethod
    def load(cls, path: Path) -> ExpectedCounts:
        if not path.exists():
            return cls()
        data = json.loads(path.read_text("utf-8"))
        return cls(delivered=data["delivered"], valid_distinct=data["valid_distinct"],
                   duplicates=data["duplicates"],
                   invalid_by_reason=Counter(data["invalid_by_reason"]),
                   blank_lines=data["blank_lines"], files=data["files"])

    def add(self, other: ExpectedCounts) -> None:
        self.delivered += other.delivered
        self.valid_distinct += other.valid_distinct
        self.duplicates += other.duplicates
        self.invalid_by_reason.update(other.invalid_by_reason)
        self.blank_lines += other.blank_lines
        self.files += other.files
