"""The route class of an API family that answers errors in its own shape (E2B's, Judge0's)."""

from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any

from fastapi import Request, Response
from fastapi.routing import APIRoute

from sandpod_gateway.web.errors import GatewayError, as_gateway_error


class FamilyRoute(APIRoute, ABC):
    """A route whose errors (its dependencies' included) take its family's shape: the
    family's own exceptions and request validation by `family_error`, every other error the
    gateway knows (as_gateway_error) by `gateway_error`."""

    @abstractmethod
    def family_error(self, exc: Exception) -> Response | None:
        """The answer to `exc` if it is one of the family's own (or a validation error)."""

    @abstractmethod
    def gateway_error(self, error: GatewayError) -> Response:
        """The answer to an error of the gateway's, in the family's shape."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def family_handler(request: Request) -> Response:
            try:
                return await handler(request)
            except Exception as exc:
                answer = self.family_error(exc)
                if answer is not None:
                    return answer
                retry_after = request.app.state.settings.default_retry_after_seconds
                error = as_gateway_error(exc, retry_after)
                if error is None:
                    raise
                return self.gateway_error(error)

        return family_handler
