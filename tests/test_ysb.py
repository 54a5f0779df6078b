"""Genuine Yahoo Streaming Benchmark input, unchanged: events exactly as YSB's generator
writes them (no event_id, no price, event_time as epoch milliseconds in a string) and YSB's
campaign mapping (100 campaigns of 10 ads), through every layer."""

import json
import random
import time
import uuid
from datetime import UTC, datetime

from pyspark.sql import functions as F

from spark_jobs import reasons, streaming
from spark_jobs.gold import campaign_stats
from spark_jobs.silver import ad_events as silver
from spark_jobs.silver import quarantine
from spark_jobs.silver.validation import Rules, validate
from spark_jobs.storage import write_atomically
from tests.conftest import make_settings
from tests.silver_helpers import bronze_frame

YSB_AD_TYPES = ("banner", "modal", "sponsored-search", "mail", "mobile")
YSB_EVENT_TYPES = ("view", "click", "purchase")


def ysb_input(count: int) -> tuple[list[str], dict[str, str]]:
    """YSB's own shapes: its generator's JSON (keys in its order) and its ad mapping."""
    rng = random.Random(7)
    campaigns = [str(uuid.UUID(int=rng.getrandbits(128))) for _ in range(100)]
    ad_campaign = {str(uuid.UUID(int=rng.getrandbits(128))): campaign
                   for campaign in campaigns for _ in range(10)}
    ads, now_ms = list(ad_campaign), int(time.time() * 1000)
    lines = [json.dumps({
        "user_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "page_id": str(uuid.UUID(int=rng.getrandbits(128))),
        "ad_id": rng.choice(ads),
        "ad_type": rng.choice(YSB_AD_TYPES),
        "event_type": rng.choice(YSB_EVENT_TYPES),
        "event_time": str(now_ms - count + index),  # one a millisecond, all distinct
        "ip_address": "1.2.3.4"}) for index in range(count)]
    return lines, ad_campaign


def test_ysb_events_reach_silver_and_gold_unchanged_when_configured(spark, tmp_path) -> None:
    lines, ad_campaign = ysb_input(3000)
    purchases = sum('"event_type": "purchase"' in line for line in lines)
    # The defaults quarantine every YSB event: no event_id. Deriving ids, each purchase is
    # still refused for its missing price (a third of the stream) ...
    deriving = Rules(86400, derive_missing_event_id=True)
    # (Ingested now: the events are a few seconds old.)
    refused = validate(bronze_frame(spark, lines, ingested_at=datetime.now(UTC)),
                       deriving).groupBy("reason").count()
    assert {row.reason: row["count"] for row in refused.collect()} == {
        None: len(lines) - purchases, reasons.BAD_PRICE: purchases}

    # ... until purchases may come without one.
    settings = make_settings(tmp_path / "lake", derive_missing_event_id=True,
                             purchase_requires_price=False)
    write_atomically(settings.landing_campaigns, "ysb-campaigns.jsonl", "".join(
        json.dumps({"ad_id": ad, "campaign_id": campaign, "valid_from": 0}) + "\n"
        for ad, campaign in ad_campaign.items()).encode())
    write_atomically(settings.landing_events, "ysb-events.jsonl",
                     ("\n".join(lines) + "\n").encode())
    streaming.run_available_now(spark, settings, streaming.parse_layers(None))

    def table(spec):
        return spark.read.format("delta").load(spec.path(settings))

    assert table(quarantine.TABLE).count() == 0
    events = table(silver.TABLE)
    assert events.count() == len(lines)  # every event, each once
    assert events.where("event_type = 'purchase' AND price IS NULL").count() == purchases
    totals = table(campaign_stats.TABLE).agg(
        F.sum(F.col("views") + F.col("clicks") + F.col("purchases")).alias("events"),
        F.sum("purchases").alias("purchases"), F.sum("revenue").alias("revenue"),
        F.collect_set("campaign_id").alias("campaigns")).first()
    # Every event counted in gold, under YSB's own campaigns, a purchase as no revenue.
    assert (totals.events, totals.purchases, totals.revenue) == (len(lines), purchases, 0)
    assert set(totals.campaigns) <= set(ad_campaign.values())
