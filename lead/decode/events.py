"""What the engine tells those above it, and knows nothing more of them: a step began (with
its price), sessions changed (started, or their tokens did), a session ended. Lead's side
of the backs (lead/backs/) listens; the engine imports none of it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from lead.decode.runs import Run


class EngineListener(Protocol):
    def step_began(self, price: float | None) -> None:
        """A step began, priced at `price` seconds (None: unpriced, or no step under way)."""

    def sessions_changed(self, runs: Sequence[Run]) -> None:
        """These runs started, or their sessions' tokens changed."""

    def session_ended(self, run: Run) -> None:
        """`run` ended: its session's counts are final."""


class EngineEvents:
    """The engine's listeners, each told every event in the order they subscribed."""

    def __init__(self) -> None:
        self.listeners: list[EngineListener] = []

    def subscribe(self, listener: EngineListener) -> None:
        self.listeners.append(listener)

    def step_began(self, price: float | None) -> None:
        for listener in self.listeners:
            listener.step_began(price)

    def sessions_changed(self, runs: Sequence[Run]) -> None:
        for listener in self.listeners:
            listener.sessions_changed(runs)

    def session_ended(self, run: Run) -> None:
        for listener in self.listeners:
            listener.session_ended(run)
