"""Who may do what: the API key admits API clients, the back key makes a back trusted.

A trusted back's draft probabilities count (rejection sampling with its q); any other
back's drafts are verified as if chosen, not sampled, which is exact for any draft
(docs/protocol.md). With no key at all, lead cannot tell clients apart and trusts them
all; it listens on loopback by default for that reason.
"""

from __future__ import annotations

import hmac
from dataclasses import dataclass


def _bearer(key: str | None) -> bytes | None:
    return f"Bearer {key}".encode() if key else None


@dataclass(frozen=True)
class Keys:
    api_key: str | None = None
    back_key: str | None = None  # None: the API key
    more_keys: tuple[str, ...] = ()  # --api-key-file's: each admits as the API key does

    @property
    def _api(self) -> bytes | None:
        return _bearer(self.api_key)

    @property
    def _back(self) -> bytes | None:
        return _bearer(self.back_key or self.api_key)

    def admits(self, authorization: bytes, back_route: bool) -> bool:
        """Whether a request with this Authorization header may go on: anyone where there is
        no API key; else the API key, or on the back protocol's routes the back key too."""
        return self._api is None or _equal(authorization, self._api) or \
            any(_equal(authorization, _bearer(k)) for k in self.more_keys) or \
            (back_route and _equal(authorization, self._back))

    def trusted_back(self, authorization: bytes) -> bool:
        """Whether a back's draft probabilities count."""
        return self._back is None or _equal(authorization, self._back)


def _equal(given: bytes, expected: bytes | None) -> bool:
    return expected is not None and hmac.compare_digest(_scheme_as_written(given), expected)


def _scheme_as_written(authorization: bytes) -> bytes:
    """`bearer KEY` as `Bearer KEY`: the scheme's case is the client's choice (RFC 9110)."""
    scheme, space, token = authorization.partition(b" ")
    return b"Bearer " + token if space and scheme.lower() == b"bearer" else authorization
