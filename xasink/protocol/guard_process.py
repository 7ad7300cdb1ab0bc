"""``python -m xasink.protocol.guard_process``: hold one Spark driver's run guard for as long as the driver lives.

Started by :func:`xasink.protocol.liveness.ensure_keeper` with its settings on standard input (the URL carries a
password, so never on the command line).  It forks so its starter can reap it at once, takes the session
lock, answers ``ready`` (or ``held`` when another keeper already has it), and then watches: when the
driver's JVM is gone it exits and the lock goes with its connection.  A lost connection (a database
restart) is made again and the lock taken again.
"""

from __future__ import annotations

import json
import os
import sys
import time

from sqlalchemy.engine import make_url

from xasink.dialects import dialect_for
from xasink.protocol.liveness import DriverProcess

POLL_S = 0.5
PING_S = 5.0


def _say(text: str) -> None:
    try:
        print(text, flush=True)
        sys.stdout.close()
    except (OSError, ValueError):
        pass


def main() -> int:
    config = json.loads(sys.stdin.readline())
    sys.stdin.close()
    if os.fork() > 0:  # the starter reaps this parent; the child is adopted and reaped by init
        os._exit(0)
    driver = DriverProcess(int(config["pid"]), int(config["start"]))
    name = str(config["name"])
    dialect = dialect_for(make_url(config["url"]))
    conn = None
    answered = False
    last_ping = 0.0
    while driver.alive():
        try:
            if conn is None:
                conn = dialect.connect(autocommit=True)
                if not dialect.try_session_lock(conn, name):
                    conn.close()
                    conn = None
                    if not answered:  # another keeper of this driver holds it
                        _say("held")
                        return 0
                    time.sleep(1.0)  # our lock from before a reconnect is still being released
                    continue
                if not answered:
                    _say("ready")
                    answered = True
                last_ping = time.monotonic()
            elif time.monotonic() - last_ping > PING_S:
                dialect.ping(conn)
                last_ping = time.monotonic()
        except Exception as exc:  # noqa: BLE001 - a lost server: connect again
            if not answered:
                _say(f"error: {type(exc).__name__}")
                return 1
            if conn is not None:
                try:
                    conn.invalidate()
                except Exception:  # noqa: BLE001,S110
                    pass
            conn = None
            time.sleep(1.0)
            continue
        time.sleep(POLL_S)
    if conn is not None:
        conn.close()
    dialect.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
