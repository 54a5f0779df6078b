"""Ranges of event dates, as reprocessing, validation and the DAGs' parameters give them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import date, timedelta
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import Column


class DateRangeError(ValueError):
    """A range that is not one; the message names the flag and is meant for the user."""


@dataclass(frozen=True)
class DateRange:
    """Event dates ``first`` to ``last``, both included (UTC)."""

    first: date
    last: date

    @classmethod
    def parse(cls, first: str, last: str) -> DateRange:
        def day(text: str, flag: str) -> date:
            try:
                return date.fromisoformat(text)
            except ValueError:
                raise DateRangeError(f"{flag} {text!r} is not a date (YYYY-MM-DD)") from None

        days = cls(day(first, "--from"), day(last, "--to"))
        if days.first > days.last:
            raise DateRangeError(f"--from {days.first} is after --to {days.last}")
        return days

    @property
    def days(self) -> list[date]:
        return [self.first + timedelta(days=n) for n in range((self.last - self.first).days + 1)]

    def holds(self, column: str) -> Column:
        from pyspark.sql import functions as F

        return F.col(column).between(F.lit(self.first), F.lit(self.last))

    def date_predicate(self, column: str) -> str:
        """The range as SQL over a date column. Not BETWEEN: Spark 4.2 rewrites it into a
        ``With`` expression that Delta's replaceWhere check fails to resolve."""
        return f"{column} >= DATE'{self.first}' AND {column} <= DATE'{self.last}'"

    def predicate(self, column: str) -> str:
        """The range as SQL over a date column, or a timestamp column's date."""
        return (f"{column} >= TIMESTAMP'{self.first} 00:00:00' AND "
                f"{column} < TIMESTAMP'{self.last + timedelta(days=1)} 00:00:00'")

    def __str__(self) -> str:
        return f"{self.first}..{self.last}"
