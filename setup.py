"""Package layout: the repository's folders map to installed package names.

- ``curvplan/``  → ``curvplan`` (the client, the CLI and the contract ``curvplan.types``)
- ``app/``       → ``curvplan_server`` (the API, the planner, the reports)
- ``workers/``   → ``curvplan_worker`` (the job runner and the curvature engine)
- ``alembic/``   → ``curvplan_server.db_migrations`` (the migration scripts, in a wheel)

so an installed curvplan never claims a user's own top-level ``app`` package. Metadata
and dependencies live in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

LAYOUT = {"curvplan": "curvplan", "curvplan_server": "app", "curvplan_worker": "workers"}
MIGRATIONS = "curvplan_server.db_migrations"

packages: list[str] = []
package_dir: dict[str, str] = {}
for name, folder in LAYOUT.items():
    package_dir[name] = folder
    packages += [name, *(f"{name}.{sub}" for sub in find_packages(folder))]
package_dir[MIGRATIONS] = "alembic"
package_dir[f"{MIGRATIONS}.versions"] = "alembic/versions"
packages += [MIGRATIONS, f"{MIGRATIONS}.versions"]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"curvplan": ["py.typed"], MIGRATIONS: ["script.py.mako"]},
)
