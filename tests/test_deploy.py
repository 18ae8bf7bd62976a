"""docker-compose.yml and Dockerfile: no Docker engine runs here, so check what can be.

Every LEAD_*/BACK_* variable must name a real settings field (a typo would be ignored
silently at run time), back must reach lead by service name, the healthcheck must
probe /health, and lead, listening on every interface of its container, needs a key.
Where the `docker compose` plugin exists, its own validation runs too.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from back.settings import BackSettings
from lead.server.settings import LeadSettings

pytestmark = pytest.mark.process

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_compose_env_vars_are_real_settings() -> None:
    fields = {"LEAD_": LeadSettings.model_fields, "BACK_": BackSettings.model_fields}
    for name, service in COMPOSE["services"].items():
        for var in service.get("environment", {}):
            prefix = var[:5]
            assert prefix in fields, f"{name}: {var} is neither LEAD_* nor BACK_*"
            assert var[5:].lower() in fields[prefix], f"{name}: {var} is not a setting"


def test_compose_wiring() -> None:
    lead, back = COMPOSE["services"]["lead"], COMPOSE["services"]["back"]
    assert back["environment"]["BACK_LEAD"].split(":")[0] == "lead"
    assert back["depends_on"]["lead"]["condition"] == "service_healthy"
    assert "/health" in " ".join(lead["healthcheck"]["test"])
    assert "models:/models" in lead["volumes"] and "models:/models" in back["volumes"]
    assert "models" in COMPOSE["volumes"]


def test_compose_lead_listens_for_the_back_and_requires_a_key() -> None:
    lead, back = COMPOSE["services"]["lead"], COMPOSE["services"]["back"]
    assert lead["environment"]["LEAD_HOST"] == "0.0.0.0"  # the back container reaches it
    # ${VAR:?message}: compose refuses to start without the key, rather than run keyless on
    # a published port
    for key in (lead["environment"]["LEAD_API_KEY"], back["environment"]["BACK_API_KEY"]):
        assert re.fullmatch(r"\$\{DUO_API_KEY:\?[^}]+\}", key), key


def test_dockerfile_copies_what_exists() -> None:
    text = (ROOT / "Dockerfile").read_text()
    for line in re.findall(r"^COPY (.+)$", text, re.M):
        for source in line.split()[:-1]:
            assert (ROOT / source).exists(), f"Dockerfile copies missing {source}"
    assert "DUO_CACHE=/models" in text


def test_docker_compose_config_where_available() -> None:
    if shutil.which("docker") is None:
        pytest.skip("no docker client")
    check = subprocess.run(["docker", "compose", "version"], capture_output=True, text=True)
    if check.returncode != 0:
        pytest.skip("the docker compose plugin is not installed here")
    env = {k: v for k, v in os.environ.items() if k != "DUO_API_KEY"}
    done = subprocess.run(["docker", "compose", "config", "--quiet"], cwd=ROOT,
                          capture_output=True, text=True, env={**env, "DUO_API_KEY": "k"})
    assert done.returncode == 0, done.stderr
    keyless = subprocess.run(["docker", "compose", "config", "--quiet"], cwd=ROOT,
                             capture_output=True, text=True, env=env)
    assert keyless.returncode != 0 and "DUO_API_KEY" in keyless.stderr
