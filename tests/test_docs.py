"""The documentation site: the README is the front door (at most 400 lines), the guides
build as a site with MkDocs without a single warning (broken links, missing pages and
anchors fail it), and the API reference lists every operation the app's OpenAPI
description has."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.processes import ROOT


def test_the_readme_is_a_front_door():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 400
    for page in sorted((ROOT / "docs").glob("*.md")):
        if page.name != "index.md":
            assert f"(docs/{page.name})" in readme, f"the README does not lead to {page.name}"


def test_the_site_builds_strictly_with_the_whole_api_reference(tmp_path):
    built = subprocess.run(
        [str(Path(sys.executable).with_name("mkdocs")), "build", "--strict", "--site-dir",
         str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={"PATH": "/usr/bin:/bin", "NO_MKDOCS_2_WARNING": "1", "DEBUG": "0",
             "TOLLGATE_VAR_DIR": str(tmp_path / "var")})
    assert built.returncode == 0, built.stdout + built.stderr
    assert "WARNING" not in built.stderr, built.stderr
    from tollgate.api import api

    reference = (tmp_path / "site" / "api-reference" / "index.html").read_text()
    for path, operations in api.get_openapi_schema()["paths"].items():
        for method in operations:
            assert f"{method.upper()} <code>{path}</code>" in reference, (method, path)
    assert "Two commands" in (tmp_path / "site" / "index.html").read_text()
