"""Sessions through the gateway's API (`/v1/sessions`), as the suites drive them."""

from __future__ import annotations

from typing import Any

import httpx


def open_session(http: httpx.Client, language: str = "python", **options: Any) -> str:
    """A new session's id (201 asserted)."""
    response = http.post("/v1/sessions", json={"language": language, **options})
    assert response.status_code == 201, response.text
    session_id: str = response.json()["id"]
    return session_id


def run_in(http: httpx.Client, session: str, code: str, **options: Any) -> dict[str, Any]:
    """A run's answer in the session (200 asserted: it finished within the request)."""
    response = http.post(f"/v1/sessions/{session}/executions", json={"code": code, **options})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    return result
