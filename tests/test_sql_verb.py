"""``lakehouse sql``: every row the query returns, up to ``--limit``, as a plain table."""

from __future__ import annotations

import subprocess
from decimal import Decimal
from pathlib import Path

from tests.conftest import cli_env, lakehouse_command


def run_sql(*args: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(lakehouse_command("sql", *args), capture_output=True, text=True,
                          env=cli_env(), timeout=timeout)


def test_the_limit_is_stated_in_the_help_and_checked_before_spark(tmp_path: Path) -> None:
    helped = run_sql("--help", timeout=60)
    assert helped.returncode == 0
    assert "--limit N" in helped.stdout and "default 1000" in " ".join(helped.stdout.split())
    refused = run_sql("SELECT 1", "--limit", "-3", "--root", str(tmp_path), timeout=60)
    assert refused.returncode == 2 and "must not be negative" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1


def test_every_row_up_to_the_limit_as_a_text_table(tmp_path: Path) -> None:
    # The query's own LIMIT (12) returns more rows than --limit (10) lets through.
    query = ("SELECT id, CAST(power(10, id % 4) AS BIGINT) AS views, "
             "CASE WHEN id % 2 = 0 THEN 'even' END AS parity, "
             "CAST(id AS DECIMAL(10, 2)) / 4 AS share "
             "FROM range(30) ORDER BY id DESC LIMIT 12")
    done = run_sql(query, "--limit", "10", "--root", str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.rstrip("\n").splitlines()
    assert [cell.strip() for cell in lines[0].split("|")] == ["id", "views", "parity", "share"]
    assert set(lines[1]) <= {"-", "+"}
    raw = [line.split(" | ") for line in lines[2:12]]
    rows = [[cell.strip() for cell in cells] for cells in raw]
    assert [row[0] for row in rows] == [str(n) for n in range(29, 19, -1)]
    assert rows[0][:3] == ["29", "10", "NULL"] and Decimal(rows[0][3]) == Decimal("7.25")
    assert rows[1][:3] == ["28", "1", "even"]
    assert raw[2][1] == " 1000" and raw[1][1] == "    1"  # numbers right-aligned
    assert lines[12] == "(10 rows)"
    assert lines[13] == ("(only the first 10 rows: the query returns more; --limit N to see "
                         "more, --limit 0 for all)")
    assert len(lines) == 14
    assert "only showing top" not in done.stdout
