"""The study storage that waits out an unreachable database (issue 30): which errors it waits on, which it
raises at once, and that it gives up after its patience."""
import optuna
import pytest
import sqlalchemy.exc

from tuner import retrying


def connection_refused() -> sqlalchemy.exc.OperationalError:
    return sqlalchemy.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))


def read_again_on_a_dead_session() -> optuna.exceptions.StorageInternalError:
    """What Optuna raises when its second read on a session whose connection was cut fails."""
    try:
        try:
            raise connection_refused()
        except sqlalchemy.exc.OperationalError:
            raise sqlalchemy.exc.PendingRollbackError("Can't reconnect until invalid transaction is rolled back")
    except sqlalchemy.exc.PendingRollbackError as err:
        try:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit.") from err
        except optuna.exceptions.StorageInternalError as wrapped:
            return wrapped


class FlakyStorage:
    """Raises each error of `errors` in turn from `get_all_trials`, then answers."""

    def __init__(self, errors):
        self.errors, self.calls = list(errors), 0

    def get_all_trials(self, study_id):
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return [study_id]


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(retrying.time, "sleep", lambda seconds: None)


@pytest.mark.parametrize("error", [connection_refused(), read_again_on_a_dead_session()],
                         ids=["operational", "pending-rollback-after-a-cut-connection"])
def test_a_lost_connection_is_waited_out(error):
    inner = FlakyStorage([error, error])
    assert retrying.RetryingStorage(inner).get_all_trials(7) == [7]
    assert inner.calls == 3


@pytest.mark.parametrize("error", [ValueError("bad value"), sqlalchemy.exc.PendingRollbackError("no cause"),
                                   optuna.exceptions.StorageInternalError("exceeding max length")])
def test_an_error_of_the_call_itself_is_raised_at_once(error):
    inner = FlakyStorage([error])
    with pytest.raises(type(error)):
        retrying.RetryingStorage(inner).get_all_trials(7)
    assert inner.calls == 1


def test_the_error_is_raised_once_patience_runs_out():
    inner = FlakyStorage([connection_refused()] * 100)
    with pytest.raises(sqlalchemy.exc.OperationalError):
        retrying.RetryingStorage(inner, patience=3.0).get_all_trials(7)
    assert 3 <= inner.calls < 100
