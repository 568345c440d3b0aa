"""README's downloads API line names every admin route for downloads (the pause route, which
`swarmllm download --resume`'s Ctrl-C uses, was missing from it: found in review, 2026-12-07)."""

from __future__ import annotations

from node.api.admin import routes
from tests.support.processes import REPO


def test_the_readme_names_every_download_route():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    paths = {r.path for r in routes if r.path.startswith("/api/admin/downloads")}
    assert "/api/admin/downloads/{job_id}/pause" in paths  # (the routes are read as the API registers them)
    for path in paths:
        action = path.rsplit("/", 1)[1]
        said = "/api/admin/downloads[/{id}]" if action in ("downloads", "{job_id}") else f"/{{id}}/{action}"
        assert said in readme, f"README.md does not name {path}"
