# Copied into the suite's unit/ folder by scripts/llama-server-suite.sh.
# The suite's own session fixture starts every preset once so that each downloads its
# model from a hub before the tests; here no hub is reachable and scripts/llama-server
# maps every hub model to a local GGUF, so there is nothing to download first.
import pytest


@pytest.fixture(scope="session", autouse=True)
def load_server_presets():
    yield
