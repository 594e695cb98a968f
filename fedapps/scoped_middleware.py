"""The SuperLink's HTTP middleware, each layer only on the paths it acts on (holding SuperLink).

Flower 1.42's SuperLink serves its Fleet, ServerApp and Control APIs from one FastAPI app with
eight middleware layers, each a Starlette `BaseHTTPMiddleware`, and every request passes all
eight: six of them act only on Control or only on Fleet paths and hand every other request on
unchanged, but a `BaseHTTPMiddleware` costs its task group, streams and wrapped response even
when it only passes a request through. A deployed round is a few hundred small requests (each
object of each message is pushed and pulled with one of its own), and on 20 SuperNodes sharing
2 cores a profile put much of the SuperLink's CPU in this machinery (docs/PERFORMANCE.md, "The
SuperLink's middleware").

`install()` wraps each of those six in `OnPaths`, a plain ASGI layer that sends a request whose
path does not contain the middleware's scope (`/v1/control/`, `/v1/fleet/`) straight to the next
layer, and every other request through the middleware as before. Nothing else changes: the
error translator and the protobuf translation still see every request, and a Fleet request
still passes node authentication and the Fleet event log. The test is a substring one, looser
than Flower's own (`request.url.path.startswith`), so a request a middleware would act on never
skips it. A middleware is scoped only if it is one of `SCOPES` and its `dispatch` still names
the helper or prefix its pass-through test uses; anything else, an extension's middleware
included, stays as Flower has it. Installed by fedapps/quick_superlink.py (`--link-hold`).
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable
from typing import Any

SUPERLINK_MAIN = "flwr.superlink.main"
CONTROL, FLEET = "/v1/control/", "/v1/fleet/"
# Flower's middleware that acts on one API's paths only: class name -> (module, that API's
# path prefix, what its dispatch's pass-through test names).
SCOPES = {
    "ControlSensitiveResponseMiddleware": ("flwr.superlink.routers.control.middlewares",
                                           CONTROL, "_is_control_sensitive_route"),
    "ControlAuthenticationMiddleware": ("flwr.superlink.routers.control.middlewares",
                                        CONTROL, "_is_control_path"),
    "ControlLicenseMiddleware": ("flwr.superlink.routers.control.middlewares", CONTROL,
                                 "_is_control_path"),
    "ControlEventLogMiddleware": ("flwr.superlink.routers.control.middlewares", CONTROL,
                                  "_is_control_path"),
    "NodeAuthMiddleware": ("flwr.superlink.routers.fleet.node_auth", FLEET, f'"{FLEET}"'),
    "FleetEventLogMiddleware": ("flwr.superlink.routers.fleet.middlewares", FLEET,
                                f'"{FLEET}"'),
}


class OnPaths:
    """A plain ASGI layer: HTTP requests whose path contains `path_part` go through
    `middleware` (built on the next layer as Starlette would build it), all others straight to
    the next layer. A middleware that is itself a `BaseHTTPMiddleware` passes non-HTTP events
    (lifespan) straight on too, so those skip it here as well."""

    def __init__(self, app: Any, middleware: type, path_part: str, args: tuple = (),
                 kwargs: dict | None = None) -> None:
        self.app, self.path_part = app, path_part
        self.middleware = middleware(app, *args, **(kwargs or {}))

    async def __call__(self, scope: dict, receive: Callable, send: Callable) -> None:
        if scope["type"] == "http" and self.path_part in scope["path"]:
            await self.middleware(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def scope_of(cls: type) -> str | None:
    """The path prefix `cls` acts on, if it is one of SCOPES as flwr 1.42 writes it."""
    known = SCOPES.get(getattr(cls, "__name__", ""))
    if known is None:
        return None
    module, prefix, marker = known
    try:
        if getattr(importlib.import_module(module), cls.__name__) is not cls:
            return None
        source = inspect.getsource(cls.dispatch)
    except (ImportError, AttributeError, OSError, TypeError):
        return None
    return prefix if marker in source else None


def scoped(middleware: list) -> tuple[list, int]:
    """Flower's middleware list with each SCOPES entry wrapped in OnPaths, and how many were."""
    from starlette.middleware import Middleware

    result, wrapped = [], 0
    for entry in middleware:
        prefix = scope_of(entry.cls) if isinstance(entry, Middleware) else None
        if prefix is None:
            result.append(entry)
        else:
            result.append(Middleware(OnPaths, middleware=entry.cls, path_part=prefix,
                                     args=entry.args, kwargs=entry.kwargs))
            wrapped += 1
    return result, wrapped


def install() -> int:
    """Scope the middleware of the SuperLink app this process will create; how many layers
    were scoped (0, leaving Flower's as it is, on a SuperLink without `_get_middleware`)."""
    main = importlib.import_module(SUPERLINK_MAIN)
    flower = getattr(main, "_get_middleware", None)
    if flower is None or getattr(flower, "__wrapped_by_fedapps__", False):
        return 0
    count = scoped(flower())[1]

    def get_middleware() -> list:
        return scoped(flower())[0]

    get_middleware.__wrapped_by_fedapps__ = True  # type: ignore[attr-defined]
    main._get_middleware = get_middleware
    return count
