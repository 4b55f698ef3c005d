"""The gate's loggers: each call runs with Prefect's timeout held off until it returns.

Before Python 3.12, ``logging.Handler.handle`` calls ``self.acquire()`` and only then enters its ``try``: an
exception raised into the thread as the lock's ``acquire`` returns (Prefect's sync timeout:
``PyThreadState_SetAsyncExc`` in a worker thread, its SIGALRM handler in the main thread) leaves the handler's
``RLock`` held by that thread, and every other thread logging through that handler then waits for ever. Measured
on Python 3.11.7: 4 of 3,205 exceptions raised at random into a thread logging in a loop left the lock held
(3.12 and later use ``with self.lock:``, which releases it). The gate logs from the task's thread before its
body's shield is up (waiting for admission, giving a lease back, a job that never fits), so each call here is
made inside Prefect's thread shield (:func:`~lane_plugin.gating.timeouts.shield`), which defers a timeout to the
shield's end: it is raised after the handler let go of its lock.
"""

from __future__ import annotations

import logging
from typing import Any

from . import timeouts


class ShieldedLogger:
    """A logger (or Prefect's run-logger adapter) whose calls a Prefect timeout cannot interrupt halfway.

    Anything other than the logging calls is the wrapped logger's.
    """

    __slots__ = ("logger",)

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter) -> None:
        self.logger = logger

    def __getattr__(self, name: str) -> Any:
        return getattr(self.logger, name)

    def isEnabledFor(self, level: int) -> bool:  # noqa: N802 - logging's name
        with timeouts.shield():  # on a cache miss it takes logging's module lock, the same way
            return self.logger.isEnabledFor(level)

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(level, msg, args, kwargs)

    def debug(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.DEBUG, msg, args, kwargs)

    def info(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.INFO, msg, args, kwargs)

    def warning(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.WARNING, msg, args, kwargs)

    def error(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, kwargs)

    def exception(self, msg: object, *args: object, exc_info: Any = True, **kwargs: Any) -> None:
        self._log(logging.ERROR, msg, args, {"exc_info": exc_info, **kwargs})

    def critical(self, msg: object, *args: object, **kwargs: Any) -> None:
        self._log(logging.CRITICAL, msg, args, kwargs)

    def _log(self, level: int, msg: object, args: tuple, kwargs: dict[str, Any]) -> None:
        kwargs["stacklevel"] = kwargs.get("stacklevel", 1) + 2  # the record names the caller, not this and _log
        with timeouts.shield():
            self.logger.log(level, msg, *args, **kwargs)


def shielded(name: str) -> ShieldedLogger:
    """``logging.getLogger(name)``, its calls shielded from Prefect's timeout."""
    return ShieldedLogger(logging.getLogger(name))


__all__ = ["ShieldedLogger", "shielded"]
