"""Where a downloaded file came from and what the origin check found, as kept in its hash cache
record (`model_hashes.json`: `origin`, `public`, `rule`, `token`): one frozen type read and written
by hash_cache.py and read by origin_checks.py (2026-12-07: both read the JSON's keys themselves).

Read from disk, anything not as written here is never public: a `public` that is not `true`,
`false` or "unchecked" (a string "true", a number, null) is read as unchecked, not public and
checked again at the next start, asked without a token; a `rule` that is not an integer is no rule
(a `public: true` under it is checked again); a `token` that is not a boolean is "sent"; an
`origin` that is not a non-empty string is no origin (not public, not checked). A record without
`public` (written before 2026-12-06, or a check that never finished) is not public and not asked."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from node.values import int_or_none

# a record's `public` when the origin check could not be made (the network, not the file): not public,
# and checked again at the next start (origin_checks.py; 2026-12-07: recorded false for good)
UNCHECKED = "unchecked"
# the origin check's rule a `public: true` record was decided under (its `rule`); one decided under an
# older rule (none recorded: 2026-12-07's, which called any redirect to another host public, then one
# that followed redirects to LAN hosts) is not trusted: not public, and checked again at start as an
# UNCHECKED one is (2026-12-07 review: such records were shared for good). 3: a download that sent
# no token is asked too (rule 2 called it public with no request, so a mirror redirecting to a LAN
# store had its file shared: review r31, 2026-12-07); a rule-2 `public: true` is checked again
PUBLIC_RULE = 3

_KEYS = ("origin", "public", "rule", "token")



@dataclass(frozen=True)
class OriginRecord:
    url: str | None = None  # the download's origin URL (None: not downloaded, the user's own file)
    checked: bool = False  # a check's result is recorded (False: none yet, or a record older than checks)
    public: bool = False  # that result: anyone can fetch the file at `url` (under `rule`)
    unchecked: bool = False  # the check could not be made (or its result cannot be read): checked again
    rule: int | None = None  # the rule `public` was decided under
    token_sent: bool = True  # the download sent a Hugging Face token (not recorded: taken as sent)

    @classmethod
    def from_json(cls, record: Any) -> OriginRecord:
        """The origin fields of a hash cache record (a dict read from JSON; anything else: none)."""
        if not isinstance(record, dict):
            return cls()
        url = record.get("origin")
        url = url if isinstance(url, str) and url else None
        token = record.get("token")
        fields: dict[str, Any] = {"url": url, "rule": int_or_none(record.get("rule")),
                                  "token_sent": token if isinstance(token, bool) else True}
        if "public" in record:
            public = record["public"]
            if isinstance(public, bool):
                fields.update(checked=True, public=public)
            else:  # UNCHECKED, or not readable: not public, asked again
                fields.update(checked=True, unchecked=True)
        return cls(**fields)

    def to_json(self) -> dict[str, Any]:
        """The fields as a hash cache record keeps them (merged into the record, replacing `_KEYS`)."""
        out: dict[str, Any] = {}
        if self.url is not None:
            out["origin"] = self.url
        if self.checked:
            out["public"] = UNCHECKED if self.unchecked else self.public
            if self.rule is not None:
                out["rule"] = self.rule
            if self.unchecked:
                out["token"] = self.token_sent
        return out

    def merged_into(self, record: dict[str, Any]) -> dict[str, Any]:
        """`record` with its origin fields replaced by these (the others kept)."""
        return {**{k: v for k, v in record.items() if k not in _KEYS}, **self.to_json()}

    def checked_as(self, public: bool | None, *, sent_token: bool) -> OriginRecord:
        """This origin with a check's result under PUBLIC_RULE (None: it could not be made, kept with
        whether the download sent a token, for the check made again)."""
        return OriginRecord(url=self.url, checked=True, public=public is True, unchecked=public is None,
                            rule=PUBLIC_RULE, token_sent=bool(sent_token) if public is None else True)

    @property
    def shared(self) -> bool:
        """Public under this PUBLIC_RULE: its file may be handed out unloaded."""
        return self.url is not None and self.public and not self.unchecked and self.rule == PUBLIC_RULE

    @property
    def check_again(self) -> bool:
        """Checked again at start: unchecked, or found public under an older rule."""
        return self.url is not None and (self.unchecked or (self.public and self.rule != PUBLIC_RULE))
