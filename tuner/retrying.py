"""A study storage that waits out a database that cannot be reached, so a fleet's workers outlive a restart of
their PostgreSQL server: every storage call that fails for want of a connection is tried again, with waits
growing to `RETRY_WAIT_MAX` seconds, for up to `PATIENCE` seconds, and only then raised. A worker whose result
arrives during the outage keeps it until the server is back; nothing it finished is lost."""
from __future__ import annotations

import logging
import time

import optuna
from optuna.storages import BaseStorage
from optuna.storages._heartbeat import BaseHeartbeat

log = logging.getLogger("looptool.tuner")
PATIENCE = 600.0            # seconds a storage call keeps trying before its error is raised
RETRY_WAIT_MAX = 5.0


def lost_connection(err: BaseException | None) -> bool:
    """Whether `err`, or an error it was raised from or while handling, says the database could not be reached
    (a server down or restarting), not that the call itself was wrong. (Optuna reads trials again on the same
    session when a read fails, so a lost connection can surface as SQLAlchemy's PendingRollbackError.)"""
    import sqlalchemy.exc
    if not isinstance(err, (sqlalchemy.exc.SQLAlchemyError, optuna.exceptions.StorageInternalError)):
        return False
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        if isinstance(err, (sqlalchemy.exc.OperationalError, sqlalchemy.exc.InterfaceError)):
            return True
        if isinstance(err, sqlalchemy.exc.DBAPIError) and err.connection_invalidated:
            return True
        err = err.__cause__ or err.__context__
    return False


class RetryingStorage(BaseStorage, BaseHeartbeat):
    """`inner` (an RDBStorage) with every call tried again while the database cannot be reached."""

    def __init__(self, inner: BaseStorage, patience: float = PATIENCE):
        self.inner, self.patience = inner, patience

    def __getattr__(self, name):            # the inner storage's attributes that are not calls (engine, url)
        return getattr(self.inner, name)

    def call(self, name: str, *args, **kwargs):
        """`inner.<name>(*args, **kwargs)`, tried again while the database cannot be reached."""
        waited, wait = 0.0, 0.25
        while True:
            try:
                return getattr(self.inner, name)(*args, **kwargs)
            except Exception as err:
                if not lost_connection(err) or waited >= self.patience:
                    raise
                if waited == 0:
                    log.warning("study storage unreachable (%s); trying again for up to %.0f s",
                                str(err.__cause__ or err).splitlines()[0][:200], self.patience)
            time.sleep(wait)
            waited, wait = waited + wait, min(2 * wait, RETRY_WAIT_MAX)


def _forwarded(name: str):
    def method(self, *args, **kwargs):
        return self.call(name, *args, **kwargs)
    method.__name__ = name
    method.__doc__ = f"`{name}` of the inner storage, tried again while the database cannot be reached."
    return method


for _name in [n for base in (BaseStorage, BaseHeartbeat) for n in vars(base)
              if callable(vars(base)[n]) and not n.startswith("__")]:
    setattr(RetryingStorage, _name, _forwarded(_name))
RetryingStorage.__abstractmethods__ = frozenset()
