"""The back's HTTP client for lead's /duo protocol (transport injectable for tests)."""

from __future__ import annotations

import httpx

from shared.protocol import DraftPost, Info, State
from shared.web import auth_headers, error_message, lead_url, retry_after


class LeadError(Exception):
    """Lead answered, but not with what the protocol promises (4xx/5xx)."""

    def __init__(self, message: str, status: int = 0, retry_after: float = 0.0) -> None:
        super().__init__(message)
        self.status, self.retry_after = status, retry_after


class LeadClient:
    def __init__(self, address: str, api_key: str | None = None,
                 transport: httpx.AsyncBaseTransport | None = None,
                 poll_wait: float = 10.0, kind: str = "") -> None:
        """`kind`: the drafter (model, ngram), sent with polls for lead's page."""
        self.poll_wait, self.kind = poll_wait, kind
        self._http = httpx.AsyncClient(base_url=lead_url(address), headers=auth_headers(api_key),
                                       transport=transport,
                                       timeout=httpx.Timeout(5.0, read=poll_wait + 10.0))

    @property
    def base_url(self) -> str:
        return str(self._http.base_url)

    async def close(self) -> None:
        await self._http.aclose()

    async def info(self) -> Info:
        return Info.model_validate(await self._get("/duo/info", {}))

    async def state(self, since: int, offset: int, wait: float | None = None,
                    back_id: str = "", quiet: str = "", idle: bool = False) -> State:
        """Long-poll lead's state; `quiet` (a session id): wake only when drafts are wanted,
        or with `idle`, only when that session ends or another starts."""
        params: dict[str, float | str] = {
            "since": since, "offset": offset, "back": back_id, "quiet": quiet,
            "wait": self.poll_wait if wait is None else wait}
        if self.kind:
            params["kind"] = self.kind
        if idle:
            params["idle"] = 1
        return State.model_validate(await self._get("/duo/state", params))

    async def post_draft(self, post: DraftPost) -> State:
        response = await self._http.post("/duo/draft", json=post.model_dump(exclude_none=True))
        return State.model_validate(self._json(response))

    async def _get(self, path: str, params: dict[str, float | str]) -> object:
        return self._json(await self._http.get(path, params=params))

    @staticmethod
    def _json(response: httpx.Response) -> object:
        if response.status_code >= 400:
            raise LeadError(f"lead answered {response.status_code}: {error_message(response)}",
                            response.status_code, retry_after(response))
        return response.json()
