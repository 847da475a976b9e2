"""Package layout: each package sits in a folder named as it installs (docs/layout.md).

- ``curvplan/``                → ``curvplan`` (the client, the CLI, the contract ``curvplan.types``)
- ``app/curvplan_core/``       → ``curvplan_core`` (what the API and the workers share: settings,
  database, credentials, blob store, storage GC, the planner; no HTTP, no torch)
- ``app/curvplan_server/``     → ``curvplan_server`` (the API, the reports)
- ``workers/curvplan_worker/`` → ``curvplan_worker`` (the job runner and the curvature engine)

One folder is shipped under another name: ``alembic/`` (the real migrations, run by
``alembic.ini`` from a checkout) installs as ``curvplan_server.db_migrations`` so that a wheel
carries them. Metadata and dependencies live in ``pyproject.toml``.
"""

from setuptools import find_packages, setup

SOURCE_ROOTS = (".", "app", "workers")
TOP_LEVEL = ("curvplan", "curvplan_core", "curvplan_server", "curvplan_worker")
MIGRATIONS = "curvplan_server.db_migrations"

packages: list[str] = []
package_dir: dict[str, str] = {}
for root in SOURCE_ROOTS:
    for name in find_packages(root, include=[f"{top}*" for top in TOP_LEVEL]):
        packages.append(name)
        if root != "." and "." not in name:  # its subpackages follow their folder
            package_dir[name] = f"{root}/{name}"
package_dir[MIGRATIONS] = "alembic"
package_dir[f"{MIGRATIONS}.versions"] = "alembic/versions"
packages += [MIGRATIONS, f"{MIGRATIONS}.versions"]

setup(
    packages=packages,
    package_dir=package_dir,
    package_data={"curvplan": ["py.typed"], MIGRATIONS: ["script.py.mako"]},
)
