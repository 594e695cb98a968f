"""The holding SuperLink's scoped middleware (fedapps/scoped_middleware.py): the six layers
that act on Control or Fleet paths only are skipped elsewhere, and Flower's app answers every
kind of request exactly as before."""

from __future__ import annotations

import asyncio
import warnings

import flwr.superlink.main as superlink_main
import pytest
from starlette.middleware import Middleware

from fedapps import scoped_middleware
from fedapps.scoped_middleware import CONTROL, FLEET, OnPaths, scope_of, scoped

SCOPED = {"ControlSensitiveResponseMiddleware": CONTROL,
          "ControlAuthenticationMiddleware": CONTROL, "ControlLicenseMiddleware": CONTROL,
          "ControlEventLogMiddleware": CONTROL, "NodeAuthMiddleware": FLEET,
          "FleetEventLogMiddleware": FLEET}


def test_the_six_path_scoped_layers_are_wrapped_in_flowers_order() -> None:
    flower = superlink_main._get_middleware()
    result, count = scoped(flower)
    assert count == 6 and len(result) == len(flower)
    for before, after in zip(flower, result, strict=True):
        name = before.cls.__name__
        if name in SCOPED:
            assert after.cls is OnPaths
            assert after.kwargs["middleware"] is before.cls
            assert after.kwargs["path_part"] == SCOPED[name]
            assert (after.kwargs["args"], after.kwargs["kwargs"]) == (before.args,
                                                                      before.kwargs)
        else:  # the error translator and the protobuf translation see every request
            assert after is before
    assert sum(m.cls.__name__ == "ProtobufTranslationMiddleware" for m in result) == 1


def test_a_lookalike_or_changed_middleware_is_left_alone() -> None:
    class NodeAuthMiddleware:  # same name, not Flower's class
        async def dispatch(self, request, call_next):  # noqa: ANN001, ANN201
            return await call_next(request)  # mentions "/v1/fleet/" nowhere

    assert scope_of(NodeAuthMiddleware) is None
    entry = Middleware(NodeAuthMiddleware)
    assert scoped([entry]) == ([entry], 0)


class Recorder:
    """Stands for a middleware: records the requests that reach it, then passes them on."""

    seen: list[str] = []

    def __init__(self, app, tag: str = "") -> None:  # noqa: ANN001
        self.app, self.tag = app, tag

    async def __call__(self, scope, receive, send) -> None:  # noqa: ANN001
        Recorder.seen.append(f"{self.tag}{scope.get('path', scope['type'])}")
        await self.app(scope, receive, send)


def test_on_paths_sends_only_its_apis_requests_through_the_middleware() -> None:
    reached: list[str] = []

    async def app(scope, receive, send) -> None:  # noqa: ANN001
        reached.append(scope.get("path", scope["type"]))

    layer = OnPaths(app, Recorder, FLEET, args=("m:",))
    Recorder.seen = []
    paths = ["/v1/fleet/pull-messages", "/v1/runtime/pull-messages", "/v1/control/list-runs",
             "/prefix/v1/fleet/push-object"]
    for path in paths:
        asyncio.run(layer({"type": "http", "path": path}, None, None))
    asyncio.run(layer({"type": "lifespan"}, None, None))
    assert Recorder.seen == ["m:/v1/fleet/pull-messages", "m:/prefix/v1/fleet/push-object"]
    assert reached == [*paths, "lifespan"]  # every request still reaches the app


def answers(app) -> list[tuple]:  # noqa: ANN001
    """Status, Cache-Control and body of one request of each kind (Fleet without node
    authentication, an unknown Fleet path, Control and its sensitive route, the ServerApp's
    API without a token, a path naming another API's prefix inside it)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Starlette's note on httpx in its TestClient
        from starlette.testclient import TestClient

        client = TestClient(app)
    out = []
    for path in ["/v1/fleet/pull-messages", "/v1/fleet/nope", "/v1/control/get-login-details",
                 "/v1/runtime/get-nodes", "/v1/runtime/v1/control/x", "/health"]:
        r = client.post(path, content=b"", headers={"content-type": "application/protobuf"})
        out.append((path, r.status_code, r.headers.get("cache-control"), r.content))
    return out


def test_flowers_superlink_answers_the_same_with_its_middleware_scoped(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(superlink_main, "_get_middleware", superlink_main._get_middleware)
    before = answers(superlink_main.create_app())
    assert scoped_middleware.install() == 6
    assert scoped_middleware.install() == 0  # not wrapped twice
    app = superlink_main.create_app()
    assert sum(m.cls is OnPaths for m in app.user_middleware) == 6
    after = answers(app)
    assert after == before
    assert after[0][1] == 401  # a Fleet request still passes node authentication
    assert after[2][2] == "no-store"  # a sensitive Control answer is still not cached
