"""Listening: the app on a host and port until SIGINT or SIGTERM."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable

from aiohttp import web


async def serve_until_stopped(app: web.Application, host: str, port: int, ready: Callable[[int], None]) -> None:
    """Serve `app` on host:port (0: a free port); `ready(port)` once it listens; return after a stop signal.

    OSError when it cannot listen (the port in use, an address not of this machine)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host or None, port)
        await site.start()
        bound = runner.addresses[0][1] if runner.addresses else port
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        ready(int(bound))
        await stop.wait()
    finally:
        await runner.cleanup()
