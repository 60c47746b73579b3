"""Why a relayed answer's figures could not be read, and the one rule for a count in them."""

from __future__ import annotations

from enum import StrEnum

MAX_COUNT = 2**53  # as the peer vetting: past this a JSON number is no exact count
# Entries of an acceptance histogram (k + 1 for k draft tokens): no engine drafts 64 tokens a
# step, and a longer one is read in no time as unreadable instead of summed into a window.
MAX_HISTOGRAM = 64


class Unreadable(StrEnum):
    """Why a relayed answer's figures could not be read (each counted in `unreadable_reasons`)."""

    TOO_LARGE = "too_large"  # over PARSE_LIMIT: relayed, not read
    NOT_AN_ANSWER = "not_an_answer"  # not JSON, or not an object, or an event stream of none
    TOO_DEEP = "too_deep"  # nested past the JSON decoder's depth
    CUT_MID_EVENT = "cut_mid_event"  # an event stream that ends inside an event
    NO_DONE = "no_done"  # an event stream that ends without its `data: [DONE]`
    CUT = "cut"  # the upstream's answer stopped before its end (connection lost mid-body)
    STALLED = "stalled"  # the upstream sent nothing for `idle_timeout` mid-answer: cut there
    CLIENT_LEFT = "client_left"  # the client went away before the upstream's answer ended
    BAD_COUNTS = "bad_counts"  # a count that is not a whole number in [0, 2^53]
    HISTOGRAM_TOO_LONG = "histogram_too_long"  # over MAX_HISTOGRAM entries (or choices)
    ACCEPTED_OVER_DRAFTED = "accepted_over_drafted"
    HISTOGRAM_NOT_STEPS = "histogram_not_steps"  # its entries do not sum to the steps
    # SGLang's: the histogram's entries weighted by their index do not sum to the accepted tokens
    HISTOGRAM_NOT_ACCEPTED = "histogram_not_accepted"
    RATE_OUT_OF_RANGE = "rate_out_of_range"  # a reported acceptance rate not in [0, 1]


def as_count(value: object) -> int | None:
    """`value` when it is a whole number in [0, MAX_COUNT] (not a bool), else None."""
    return value if isinstance(value, int) and not isinstance(value, bool) and (
        0 <= value <= MAX_COUNT) else None


def is_rate(value: object) -> bool:
    """Whether `value` is a number in [0, 1] (not a bool)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 <= value <= 1
