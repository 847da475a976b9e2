"""Write (or check) the OpenAPI snapshot ``docs/openapi.json``.

    python scripts/openapi.py           # regenerate (what `make openapi` runs)
    python scripts/openapi.py --check   # exit 1 with a diff when the snapshot is stale

The snapshot makes every contract change a visible diff in review; it is generated,
never edited or merged by hand (on a merge conflict, regenerate it).
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path

SNAPSHOT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"


def render() -> str:
    """The API's OpenAPI document as stable, sorted JSON (no database is contacted)."""
    from curvplan_core.config import Settings
    from curvplan_server.main import create_app

    settings = Settings(database_url="postgresql://openapi@127.0.0.1:1/none", auth_disabled=False)
    app = create_app(settings)
    return json.dumps(app.openapi(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args()
    current = render()
    if not args.check:
        SNAPSHOT.write_text(current)
        print(f"wrote {SNAPSHOT}")
        return 0
    stored = SNAPSHOT.read_text() if SNAPSHOT.exists() else ""
    if stored == current:
        return 0
    diff = difflib.unified_diff(
        stored.splitlines(), current.splitlines(), "docs/openapi.json", "generated", lineterm=""
    )
    print("\n".join(list(diff)[:200]))
    print("docs/openapi.json is stale: run `make openapi` and commit the result.", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
