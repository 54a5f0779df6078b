"""The feed benchmark's arithmetic: a file's latency runs from its landing until gold first
counts every event up to and including it."""

from spark_jobs import feed_bench
from spark_jobs.feed_bench import Observations, _percentile


def test_a_files_latency_ends_at_the_first_gold_version_counting_it_whole() -> None:
    seen = Observations(
        # Three files of 1,000 events landed at t = 0, 1 and 2 s.
        landed=[(0.0, 1000), (1.0, 2000), (2.0, 3000)],
        # Gold: empty at 0.5 s; then 1,500 events (the first file whole, half the second);
        # then all 3,000 at 9 s.
        counted=[(0.5, 0), (4.0, 1500), (9.0, 3000)])
    # File 1 is whole at 4 s (4 - 0); files 2 and 3 only at 9 s (9 - 1, 9 - 2).
    assert seen.latencies() == [(0.0, 4.0), (1.0, 8.0), (2.0, 7.0)]
    # 3,000 landed, 3,000 counted: no backlog at any rate.
    assert seen.backlog_seconds(rate=1000) == 0


def test_files_gold_has_not_counted_yet_have_no_latency_and_are_backlog() -> None:
    seen = Observations(landed=[(0.0, 1000), (1.0, 2000)], counted=[(3.0, 1000)])
    assert seen.latencies() == [(0.0, 3.0)]
    # 1,000 events behind at 500 events a second: two seconds of feed.
    assert seen.backlog_seconds(rate=500) == 2.0


def test_percentiles_are_observed_values() -> None:
    values = [float(v) for v in range(1, 101)]  # 1 .. 100
    # The p-th percentile is the value at rank floor(p * n): 51 for p50, 100 for p99.
    assert _percentile(values, 0.5) == 51.0
    assert _percentile(values, 0.99) == 100.0


def _machine_keeping_up_to(capacity: int) -> tuple[list[int], object]:
    """A fake trial: keeps up with any rate up to ``capacity``; the rates tried, in order."""
    tried: list[int] = []

    def try_rate(rate: int) -> dict[str, object]:
        tried.append(rate)
        return {"rate": rate, "kept_up": rate <= capacity}
    return tried, try_rate


def test_the_search_steps_up_until_a_rate_falls_behind() -> None:
    tried, try_rate = _machine_keeping_up_to(10_000)
    trials = feed_bench.bracket(try_rate, 6_000)
    # 6,000 * 1.25 = 7,500, * 1.25 = 9,375 (all kept up), * 1.25 = 11,719: behind, which
    # brackets the capacity between the last two.
    assert tried == [6_000, 7_500, 9_375, 11_719]
    assert feed_bench.bracketed(trials)


def test_the_search_steps_down_from_a_start_above_the_capacity() -> None:
    tried, try_rate = _machine_keeping_up_to(10_000)
    assert feed_bench.bracketed(feed_bench.bracket(try_rate, 12_000))
    assert tried == [12_000, 9_600]  # 12,000 * 0.8: kept up, so bracketed at once


def test_the_search_stops_unbracketed_after_its_trials() -> None:
    tried, try_rate = _machine_keeping_up_to(100_000)
    trials = feed_bench.bracket(try_rate, 1_000, max_trials=3)
    assert tried == [1_000, 1_250, 1_562]  # every rate kept up: a lower bound only
    assert not feed_bench.bracketed(trials)
