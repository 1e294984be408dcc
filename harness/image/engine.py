"""Connect to a Docker engine, or fail with one line that says what is missing.

Both the build driver and the GPU runner need an engine; without one the user gets exit 2 and a
sentence naming the engine address that was tried, never a requests traceback.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from harness.errors import UsageError

if TYPE_CHECKING:
    import docker

DEFAULT_DOCKER_HOST = "unix:///var/run/docker.sock"


class EngineUnavailable(UsageError):
    """No Docker engine answered: nothing can be built or run in a container here."""


def _one_line(text: object, limit: int = 200) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def connect(purpose: str) -> docker.DockerClient:
    """A client whose engine answered a ping; `purpose` names what needed it, for the message."""
    import docker
    import requests

    where = os.environ.get("DOCKER_HOST") or DEFAULT_DOCKER_HOST
    try:
        client = docker.from_env()
        client.ping()
    except (docker.errors.DockerException, requests.exceptions.RequestException, OSError) as exc:
        raise EngineUnavailable(
            f"no Docker engine reachable at {where} ({_one_line(exc)}); {purpose} needs one: "
            "start dockerd or point DOCKER_HOST at a running engine"
        ) from None
    return client
