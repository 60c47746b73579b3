"""exporter/web/routes.py: one table of routes, each saying what it covers in a fleet."""

from __future__ import annotations

from exporter.web.routes import ROUTES, SCOPE_HEADER, Scope


class TestRouteTable:
    def test_every_window_route_covers_the_fleet(self):
        fleet = {(r.method, r.path) for r in ROUTES if r.scope is Scope.FLEET}
        assert fleet == {
            ("POST", "/api/v1/windows"), ("GET", "/api/v1/windows"),
            ("GET", "/api/v1/windows/{id}"), ("DELETE", "/api/v1/windows/{id}"),
            ("POST", "/api/v1/windows/{id}/stop"), ("GET", "/api/v1/windows/{id}/series"),
            ("GET", "/windows/{id}"), ("GET", "/compare")}

    async def test_each_route_is_served_and_one_exporter_says_no_scope(self, exporter):
        exp = await exporter({"targets": []})
        routes = exp.client.server.app.router.routes()
        registered = {(r.method, r.resource.canonical) for r in routes if r.resource}
        # aiohttp's canonical path drops a variable's pattern: `{tail:.*}` is `{tail}`.
        assert {(r.method, r.path.replace(":.*}", "}")) for r in ROUTES} <= registered
        response = await exp.client.get("/api/v1/targets")
        assert response.status == 200 and SCOPE_HEADER not in response.headers


class TestFleetAnswers:
    def test_each_fleet_api_route_has_one_answer_and_a_merge_from_core(self):
        from exporter.web.fanout import Fleet

        answered = [r for r in ROUTES if isinstance(r.fleet, Fleet)]
        assert {(r.method, r.path) for r in answered} == {
            ("POST", "/api/v1/windows"), ("GET", "/api/v1/windows"),
            ("GET", "/api/v1/windows/{id}"), ("DELETE", "/api/v1/windows/{id}"),
            ("POST", "/api/v1/windows/{id}/stop"), ("GET", "/api/v1/windows/{id}/series")}
        assert all(r.fleet.merge.__module__ == "exporter.core.shards" for r in answered)
        assert len({r.handler for r in answered}) == len(answered)  # one answer per route
