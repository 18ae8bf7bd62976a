"""Schemathesis against lead's own OpenAPI schema: whatever it sends, never a 5xx."""

from __future__ import annotations

import tempfile

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error

from bench.fake import FakeModel
from lead.server.app import create_app
from tests.conftest import make_settings

# A small context keeps generated max_tokens cheap; a save folder serves the slot actions
# and --props POST /props (without them each is llama-server's 501, by design).
slot_files = tempfile.TemporaryDirectory(prefix="lead-fuzz-slots-")
app = create_app(make_settings(max_draft_posts=10_000, slot_save_path=slot_files.name,
                               props=True), FakeModel(n_ctx=256))
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
def test_no_input_makes_lead_fail(case: schemathesis.Case) -> None:
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
