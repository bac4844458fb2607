"""The shape of the gateway's own ASGI middlewares: they act on HTTP requests alone, and
anything else (the lifespan) passes through untouched."""

from starlette.types import ASGIApp, Receive, Scope, Send


class HttpMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        await self.handle(scope, receive, send)

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        """One HTTP request, passed on to `self.app` as the middleware sees fit."""
        raise NotImplementedError
