"""What the back does with a failure: stop on the few that retrying cannot fix (`fatal`),
else log one line, back off and retry; a failure of the draft model ends that session's
drafting, not the back (`ModelFailed`). Pure; docs/back-loop.md, "Reconnecting, and failures".
"""

from __future__ import annotations

import httpx
from httpx_ws import HTTPXWSException

from back.client import BadAnswer, LeadError, LinkClosed


class BackFatal(Exception):
    """A problem retrying cannot fix; the back stops with this one-line message."""


class ModelFailed(Exception):
    """A model-thread job raised: the draft model failed while drafting for a session."""


BRIEF_CHARS = 300  # a log line's share of a failure's message


def brief(exc: BaseException) -> str:
    """A failure's message in one short line (some quote what they failed on whole)."""
    line = (str(exc) or type(exc).__name__).splitlines()[0]
    return line if len(line) <= BRIEF_CHARS else line[:BRIEF_CHARS] + "…"


def fatal(exc: Exception, base_url: str, attached: bool) -> BackFatal | None:
    """The error to stop with, where retrying cannot help (a refused connection can: lead
    may start later); `attached`: the back has reached a lead at this address before."""
    if isinstance(exc, (httpx.UnsupportedProtocol, httpx.InvalidURL)):
        return BackFatal(f"cannot reach lead at {base_url}: {brief(exc)}")
    if not isinstance(exc, LeadError):
        return None
    if exc.status == 401:
        return BackFatal("lead refused the API key: pass --api-key (or BACK_API_KEY)")
    if exc.status == 403:  # lead's own message says why and what to pass
        return BackFatal(f"lead refused this back: {brief(exc)}")
    # Before the first attach, an answer that is no Info (the handshake's) is another server
    # or another duo; once attached, it or a proxy's 404 may come while lead restarts: retried.
    if isinstance(exc, BadAnswer) and not attached:
        return BackFatal(f"{base_url}/duo/info is not a duo lead's answer: {brief(exc)}")
    if exc.status == 404 and not attached:
        return BackFatal(f"{base_url} is not a duo lead (it answered 404 to /duo/info): "
                         "check --lead")
    return None


def outage(exc: Exception) -> str:
    """How the first failure of an outage is logged (one line, with `brief(exc)`)."""
    if isinstance(exc, LinkClosed) and exc.code:  # (1013: lead has no room for it now)
        return "lead closed the link"
    if isinstance(exc, (httpx.TransportError, HTTPXWSException)):  # (the link lost: too)
        return "lead unreachable"
    if isinstance(exc, LeadError):
        return "lead's answer is unusable"
    return "following lead failed"

