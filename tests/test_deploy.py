"""docker-compose.yml and Dockerfile: no Docker engine runs here, so check what can be.

Every LEAD_*/BACK_* variable must name a real settings field (a typo would be ignored
silently at run time), back must reach lead by service name, and the healthcheck must
probe /health. Where the `docker compose` plugin exists, its own validation runs too.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from back.settings import BackSettings
from lead.settings import LeadSettings

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
    done = subprocess.run(["docker", "compose", "config", "--quiet"], cwd=ROOT,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
