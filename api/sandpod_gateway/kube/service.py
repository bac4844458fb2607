"""What the HTTP layer needs from Kubernetes, as a protocol (the real one: kubernetes.py)."""

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from sandpod_contract.runner import OutputChunk

Resource = dict[str, Any]


class ResourceNotFound(Exception):
    """No such custom resource in that namespace."""


class ResourceAlreadyExists(Exception):
    """A custom resource of that kind and name exists already."""


class ExecutionNotFound(ResourceNotFound):
    """No such CodeExecution in that namespace."""


class ExecutionAlreadyExists(ResourceAlreadyExists):
    """A CodeExecution with that name exists already."""


class SessionNotFound(ResourceNotFound):
    """No such CodeSession in that namespace."""


class SessionAlreadyExists(ResourceAlreadyExists):
    """A CodeSession with that name exists already."""


class ExecutionRejected(Exception):
    """The API server refused the resource (schema or CEL validation)."""

    def __init__(self, message: str, causes: list[tuple[str | None, str]]) -> None:
        super().__init__(message)
        self.message = message
        self.causes = causes


class QuotaExceeded(Exception):
    """The API server refused a create: a ResourceQuota of the namespace is used up."""

    def __init__(self, quota: str, limited: str) -> None:
        super().__init__(f"exceeded quota {quota}: {limited}")
        self.quota = quota
        self.limited = limited


class QuotaNotCounted(Exception):
    """The API server refused a create: a ResourceQuota of the namespace is new (or has new
    resources) and the quota controller has not counted its usage yet."""

    def __init__(self, quota: str) -> None:
        super().__init__(f"status unknown for quota {quota}")
        self.quota = quota


class InvalidCursor(Exception):
    """A list continue token that is malformed or expired."""


class KubernetesUnavailable(Exception):
    """The API server could not be reached or failed."""


@dataclass(frozen=True)
class PageData:
    items: list[Resource]
    next_cursor: str | None


class ExecutionService(Protocol):
    async def create(self, namespace: str, manifest: Resource) -> Resource:
        """Create the CR; ExecutionAlreadyExists on a name clash, ExecutionRejected if invalid,
        QuotaExceeded or QuotaNotCounted if a ResourceQuota refuses it."""
        ...

    async def get(self, namespace: str, name: str) -> Resource:
        """The CR; ExecutionNotFound if it does not exist."""
        ...

    async def list_metadata(
        self, namespace: str, *, label_selector: str, limit: int
    ) -> list[Resource]:
        """Up to ``limit`` matching CRs, as metadata only (PartialObjectMetadata: no spec,
        no status)."""
        ...

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        """One page of CRs (all of them with limit None); InvalidCursor for a bad cursor."""
        ...

    async def cancel(self, namespace: str, name: str) -> Resource:
        """Ask the operator to cancel (annotation); the CR as patched."""
        ...

    async def wait(self, namespace: str, name: str, timeout: float) -> Resource:
        """The CR once it is terminal, or as it is when ``timeout`` seconds have passed."""
        ...

    def stream(self, namespace: str, name: str, timeout: float) -> AsyncIterator[OutputChunk]:
        """Live output chunks of the run as the pod produces them; ends with the output.

        Yields nothing if the pod is already gone. Gives up after ``timeout`` seconds.
        """
        ...

    async def read_outputs(self, namespace: str, configmap: str) -> dict[str, bytes]:
        """The output files stored in an execution's outputs ConfigMap, by key (decoded
        binaryData); empty if it does not exist."""
        ...

    async def check_ready(self) -> None:
        """Raise KubernetesUnavailable if the API server cannot serve CodeExecutions."""
        ...


class SessionService(Protocol):
    """CodeSessions, for the gateway: the same verbs as executions, with delete for cancel."""

    async def create(self, namespace: str, manifest: Resource) -> Resource:
        """Create the CodeSession; SessionAlreadyExists on a name clash, ExecutionRejected if
        invalid, QuotaExceeded or QuotaNotCounted if a ResourceQuota refuses it."""
        ...

    async def get(self, namespace: str, name: str) -> Resource:
        """The CodeSession; SessionNotFound if it does not exist."""
        ...

    async def list(
        self, namespace: str, *, label_selector: str, limit: int | None, cursor: str | None
    ) -> PageData:
        """One page of CodeSessions (all of them with limit None)."""
        ...

    async def delete(self, namespace: str, name: str) -> None:
        """Delete the CodeSession (the operator ends it); SessionNotFound if it is gone."""
        ...

    async def annotate(self, namespace: str, name: str, annotations: dict[str, str]) -> Resource:
        """Set these annotations on the CodeSession (a merge patch); SessionNotFound."""
        ...
