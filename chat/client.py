"""Talks to lead's OpenAI-compatible chat API; turns failures into one-line errors."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from httpx_sse import SSEError

from shared.wire.httpclient import auth_headers, error_message, lead_url, retry_after, sse_events
from shared.wire.scrape import read_samples


class ChatError(Exception):
    """Something the user can act on; the message is one line."""


@dataclass
class Piece:
    text: str
    from_draft: bool


@dataclass
class ReplyStats:
    tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    finish_reason: str | None = None
    t_first: float | None = None
    t_end: float = 0.0
    text: list[str] = field(default_factory=list)

    def line(self) -> str:
        elapsed = (self.t_end - self.t_first) if self.t_first else 0.0
        rate = f"{self.tokens / elapsed:.1f} tok/s" if elapsed > 0 else "- tok/s"
        share = f"{100 * self.accepted / self.drafted:.0f}%" if self.drafted else "-"
        return (f"[{self.tokens} tokens, {rate}, drafted {self.drafted} / accepted "
                f"{self.accepted}, acceptance {share}]")


class ChatClient:
    def __init__(self, lead: str, api_key: str | None = None,
                 transport: httpx.BaseTransport | None = None) -> None:
        self.base = lead_url(lead)
        self._http = httpx.Client(base_url=self.base, headers=auth_headers(api_key),
                                  transport=transport,
                                  timeout=httpx.Timeout(10.0, read=300.0))

    def close(self) -> None:
        self._http.close()

    def stream(self, messages: list[dict[str, str]], stats: ReplyStats,
               **params: object) -> Iterator[Piece]:
        body = {"messages": messages, "stream": True,
                **{k: v for k, v in params.items() if v is not None}}
        try:
            with self._http.stream("POST", "/v1/chat/completions", json=body) as response:
                self._check(response)
                for event in sse_events(response):
                    piece = self._event(event, stats)
                    if piece is not None:
                        yield piece
        except httpx.ConnectError:
            raise ChatError(f"cannot reach lead at {self.base}: is `python -m lead` "
                            "running there?") from None
        except httpx.TimeoutException:
            raise ChatError(f"lead at {self.base} stopped answering (timeout)") from None
        except httpx.TransportError as exc:
            if isinstance(exc, SSEError):  # httpx_sse's error is a TransportError
                raise ChatError(f"lead at {self.base} answered with no event stream "
                                f"({exc}); is it a duo lead?") from None
            raise ChatError(f"connection to lead lost: {exc}") from None
        except UnicodeEncodeError:  # (a ValueError) the request's own text: none of lead's
            raise ChatError("the text to send is not UTF-8 (the message or --system); "
                            "nothing was sent") from None
        except (ValueError, LookupError, TypeError, AttributeError) as exc:
            raise ChatError(f"lead at {self.base} sent a stream this chat cannot read "
                            f"({type(exc).__name__}: {exc}); is it a duo lead?") from None
        finally:
            stats.t_end = time.perf_counter()

    @staticmethod
    def _event(event: dict[str, Any], stats: ReplyStats) -> Piece | None:
        choice = event["choices"][0]
        if usage := event.get("usage"):
            stats.drafted, stats.accepted = usage["drafted_tokens"], usage["accepted_tokens"]
            stats.tokens = usage["completion_tokens"]
        stats.finish_reason = choice.get("finish_reason") or stats.finish_reason
        text = choice.get("delta", {}).get("content") or ""
        if not text:
            return None
        if stats.t_first is None:
            stats.t_first = time.perf_counter()
        stats.text.append(text)
        return Piece(text, event.get("duo", {}).get("accepted", 0) > 0)

    def _check(self, response: httpx.Response) -> None:
        if response.status_code < 400:
            return
        response.read()
        if response.status_code == 401:
            raise ChatError("lead refused the API key: pass --api-key (or DUO_API_KEY)")
        if response.status_code == 429:
            raise ChatError("lead is busy (its queue is full); try again in "
                            f"{retry_after(response):g} s")
        raise ChatError(f"lead answered {response.status_code}: {error_message(response)}")

    def metrics(self) -> dict[str, float]:
        try:
            response = self._http.get("/metrics")
        except httpx.TransportError:
            raise ChatError(f"cannot reach lead at {self.base}") from None
        self._check(response)
        return {name.removeprefix("duo_"): value
                for name, value in read_samples(response.text).items()}
