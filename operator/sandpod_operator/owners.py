"""Owner references of the operator's objects: who a child belongs to."""

from collections.abc import Mapping
from typing import Any, cast

import kopf
from sandpod_contract.names import API_VERSION, KIND

from sandpod_operator.kube import Manifest


def as_body(manifest: Manifest) -> kopf.Body:
    """A kopf view of a plain object, for kopf.adopt and kopf.event."""
    return kopf.Body(cast(kopf.RawBody, manifest))


def owned_by(child: Mapping[str, Any], uid: str, kind: str = KIND) -> bool:
    """Whether a child carries the ownerReference of our `kind` object with this uid (an
    execution's by default)."""
    owners = (child.get("metadata") or {}).get("ownerReferences") or []
    return any(
        owner.get("kind") == kind
        and owner.get("apiVersion") == API_VERSION
        and owner.get("uid") == uid
        for owner in owners
    )
