"""How the worker words a failed call for its log, and retries a database call while the
database is away."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

from sqlkit.errors import CourierError

log = logging.getLogger("courier.worker")


def one_line(error: BaseException) -> str:
    if isinstance(error, CourierError):
        return error.one_line()
    return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


async def call_with_retry(action: Callable[[], Awaitable[object]], attempts: int = 5) -> None:
    for attempt in range(attempts):
        try:
            await action()
            return
        except CourierError as error:
            if attempt == attempts - 1:
                raise
            log.warning("database call failed; retrying", extra={"error": error.one_line()})
            await asyncio.sleep(0.5 * 2**attempt)
