"""`helm test`: run one execution through the gateway's Service and check its output.

Standard library only (it runs in the gateway image with `python3 -c`). Environment:
GATEWAY_URL, API_KEY, API_KEYS_REFRESH_SECONDS, LANGUAGE, CODE, EXPECTED_STDOUT, TIMEOUT_SECONDS.

A key the chart has just added takes each gateway replica up to API_KEYS_REFRESH_SECONDS to
load, so a 401 is retried until then (plus a margin); the Service may pick another replica
each time, so the execution's own request is retried too. So is a 503 quota_not_counted: the
tenant namespace's ResourceQuota that the install has just made is not counted yet.
"""

import json
import os
import sys
import time
import urllib.error
import urllib.request
from typing import Any

READY_DEADLINE_SECONDS = 120
KEY_MARGIN_SECONDS = 60
RETRY_SECONDS = 2
# The gateway waits for the result: the program's timeout plus pod start under gVisor.
REQUEST_MARGIN_SECONDS = 150


def fail(message: str) -> None:
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def call(
    method: str, url: str, key: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int, dict[str, Any]]:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(url, data=data, method=method)
    request.add_header("Authorization", f"Bearer {key}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.loads(response.read() or b"{}")
    except urllib.error.HTTPError as error:
        text = error.read().decode(errors="replace")
        try:
            return error.code, json.loads(text)
        except ValueError:
            return error.code, {"body": text}


def wait_ready(base: str, key: str) -> None:
    deadline = time.monotonic() + READY_DEADLINE_SECONDS
    last = "no answer"
    while time.monotonic() < deadline:
        try:
            status, body = call("GET", f"{base}/readyz", key, None, timeout=10)
        except OSError as error:
            last = str(error)
        else:
            if status == 200:
                return
            last = f"{status} {body}"
        time.sleep(RETRY_SECONDS)
    fail(f"the gateway at {base} is not ready after {READY_DEADLINE_SECONDS}s: {last}")


def not_yet(status: int, result: dict[str, Any]) -> str | None:
    """Why the gateway cannot take the request yet, if that is why it refused it."""
    if status == 401:
        return "the gateway has not loaded the key yet"
    if status == 503 and (result.get("error") or {}).get("code") == "quota_not_counted":
        return "the tenant namespace's new ResourceQuota is not counted yet"
    return None


def call_accepted(
    method: str, url: str, key: str, body: dict[str, Any] | None, timeout: float
) -> tuple[int, dict[str, Any]]:
    """`call`, again while the gateway does not know the key yet (401) or the namespace's
    quota is not counted yet (503 quota_not_counted), until its deadline."""
    deadline = time.monotonic() + float(os.environ["API_KEYS_REFRESH_SECONDS"])
    deadline += KEY_MARGIN_SECONDS
    status, result = call(method, url, key, body, timeout)
    said = None
    while (reason := not_yet(status, result)) is not None and time.monotonic() < deadline:
        if reason != said:
            print(f"{status}: {reason}; trying again until it is")
            said = reason
        time.sleep(RETRY_SECONDS)
        status, result = call(method, url, key, body, timeout)
    return status, result


def main() -> None:
    base = os.environ["GATEWAY_URL"].rstrip("/")
    key = os.environ.get("API_KEY", "")
    if not key:
        fail(
            "no API key: the chart makes one when it renders the keys Secret for at least one"
            " tenant; with apiKeys.existingSecret, set test.apiKey"
        )
    timeout_seconds = int(os.environ["TIMEOUT_SECONDS"])
    wait_ready(base, key)
    request = {
        "language": os.environ["LANGUAGE"],
        "code": os.environ["CODE"],
        "timeout_seconds": timeout_seconds,
    }
    print(f"POST {base}/v1/executions {json.dumps(request)}")
    status, result = call_accepted(
        "POST",
        f"{base}/v1/executions",
        key,
        request,
        timeout=timeout_seconds + REQUEST_MARGIN_SECONDS,
    )
    print(f"{status} {json.dumps(result)}")
    if status != 200:
        fail(f"expected 200 with the finished execution, got {status}")
    if result.get("status") != "success":
        fail(f"the execution ended {result.get('status')}: {result.get('error_message')}")
    expected = os.environ["EXPECTED_STDOUT"]
    if result.get("stdout") != expected:
        fail(f"stdout {result.get('stdout')!r}, expected {expected!r}")
    print(f"ok: execution {result.get('id')} printed {expected!r}")


if __name__ == "__main__":
    main()
