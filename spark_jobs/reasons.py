"""Machine-readable quarantine reason codes: one per rule of contract section 3.

When a record breaks several rules, the first in ``PRECEDENCE`` is its reason; the detail
text names every rule it broke.
"""

INVALID_ENCODING = "invalid_encoding"  # bytes that are not UTF-8
MALFORMED_JSON = "malformed_json"  # not JSON, or truncated
NOT_AN_OBJECT = "not_an_object"  # valid JSON, but an array, a scalar or null
EMPTY_RECORD = "empty_record"  # {}
MISSING_EVENT_ID = "missing_event_id"  # missing, null or empty
INVALID_EVENT_ID = "invalid_event_id"  # not a string
MISSING_EVENT_TIME = "missing_event_time"  # missing or null
BAD_EVENT_TIME = "bad_event_time"  # empty, wrong type, or not an accepted spelling of a time
FUTURE_EVENT_TIME = "future_event_time"  # more than the tolerance after ingestion
MISSING_EVENT_TYPE = "missing_event_type"  # missing, null or empty
UNKNOWN_EVENT_TYPE = "unknown_event_type"  # not view, click or purchase
MISSING_AD_ID = "missing_ad_id"  # missing, null or empty
INVALID_AD_ID = "invalid_ad_id"  # not a string
BAD_PRICE = "bad_price"  # a purchase without a valid price >= 0

# Not a reason: the generator's word for a record silver must accept.
VALID = "valid"

PRECEDENCE = (
    INVALID_ENCODING, MALFORMED_JSON, NOT_AN_OBJECT, EMPTY_RECORD,
    MISSING_EVENT_ID, INVALID_EVENT_ID,
    MISSING_EVENT_TIME, BAD_EVENT_TIME, FUTURE_EVENT_TIME,
    MISSING_EVENT_TYPE, UNKNOWN_EVENT_TYPE,
    MISSING_AD_ID, INVALID_AD_ID,
    BAD_PRICE,
)

# Campaign mapping lines (contract section 2) that cannot be used: not an object with a
# non-empty ad_id and campaign_id and a parseable valid_from.
BAD_CAMPAIGN_MAPPING = "bad_campaign_mapping"
