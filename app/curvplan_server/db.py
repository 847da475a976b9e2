"""The API's database session per request: :data:`SessionDep`.

The session is committed after the endpoint returns and rolled back if it raises. The engine
and the session factory are the core's (:mod:`curvplan_core.db`).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from sqlalchemy.orm import Session, sessionmaker


async def get_db(request: Request) -> AsyncIterator[Session]:
    """FastAPI dependency: one session per request, committed on success, rolled back on error.

    The session factory lives on ``request.app.state.sessionmaker`` (set by
    ``create_app``); tests override this dependency to bind a per-test
    transaction. Creating a session does no I/O (the connection is taken on first
    use), so this runs on the event loop and only the commit/rollback go to a
    worker thread.
    """
    factory: sessionmaker[Session] = request.app.state.sessionmaker
    session = factory()
    try:
        yield session
        if session.in_transaction():
            await run_in_threadpool(session.commit)
    except BaseException:
        if session.in_transaction():
            await run_in_threadpool(session.rollback)
        raise
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


# scope="function": commit BEFORE the response is sent, so a 2xx means the row is durable.
SessionDep = Annotated[Session, Depends(get_db, scope="function")]
