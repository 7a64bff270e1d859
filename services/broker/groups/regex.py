"""Topic regular expressions of KIP-848 subscriptions (ConsumerGroupHeartbeat v1).

Kafka compiles `SubscribedTopicRegex` with RE2/J and matches whole topic names
(`Matcher.matches()`). google-re2 is the RE2 C++ library itself, so the syntax and the
linear-time matching are the same; no backtracking constructs (lookaround,
backreferences, possessive quantifiers) exist in either, and an expression using them
is refused as INVALID_REGULAR_EXPRESSION as Kafka refuses it. Differences left: RE2/J
follows Java's `\\Q...\\E` and Unicode class names of its own version, which RE2 C++
may name differently in rare cases.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import re2

# Topics a regular expression never matches (Kafka's Topic.isInternal).
INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state", "__share_group_state"})


class RegexError(ValueError):
    """Not a valid RE2 expression; the message says why."""


@lru_cache(maxsize=256)
def compile_regex(pattern: str) -> Any:
    """The compiled expression (cached: every heartbeat of a member matches it again)."""
    try:
        # Without this, google-re2 logs every refused pattern to stderr itself.
        options = re2.Options()
        options.log_errors = False
        return re2.compile(pattern, options)
    except re2.error as e:
        why = e.args[0] if e.args else "invalid pattern"
        text = why.decode(errors="replace") if isinstance(why, bytes) else str(why)
        raise RegexError(text) from None
