"""Server-Sent Events as the gateway sends them, read the way a client reads them."""

import json
from collections.abc import Iterable, Iterator
from typing import Any


def iter_sse(lines: Iterable[str]) -> Iterator[tuple[str, Any]]:
    """(event, JSON data) of each Server-Sent Event, as soon as its blank line arrives."""
    event, data = "message", list[str]()
    for line in lines:
        if line == "":
            if data:
                yield event, json.loads("\n".join(data))
            event, data = "message", []
        elif line.startswith("event:"):
            event = line[len("event:") :].strip()
        elif line.startswith("data:"):
            data.append(line[len("data:") :].removeprefix(" "))
