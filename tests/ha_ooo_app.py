"""A small application on the HA client with a file bookmark store, for
tests/test_ha_cli.py (run as a process: ``python ha_ooo_app.py URI TOPIC STORE_DIR MODE``).

It subscribes to TOPIC with a bookmark subscription whose original bookmark is EPOCH
(``0``), sub_id ``ooo-app``, and reports on stdout, one line each (flushed):

- ``got N DUP`` for each message received (N from its payload ``{"n": N}``, DUP 1 when
  it is flagged ``possible_duplicate``, else 0);
- ``processed N`` after it called ``processed()`` on message N.

Modes:

- ``crash ORDER``: receive messages up to the highest ORDER names (comma-separated
  payload numbers: ``1,2,5,3`` receives 1..5), process those ORDER names in its order,
  then crash (``os._exit``: no cleanup, the store is not closed);
- ``resume COUNT``: receive COUNT messages, process each, print ``done`` and exit
  normally.
"""

from __future__ import annotations

import os
import sys

import orjson
import trio

from amps_py.client import FileBookmarkStore, HAMessage, open_ha_client


def say(line: str) -> None:
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


async def main(uri: str, topic: str, store_dir: str, mode: str, arg: str) -> None:
    store = FileBookmarkStore(store_dir)
    async with (
        open_ha_client("ooo-app", [uri], bookmark_store=store) as ha,
        ha.subscribe(topic, bookmark="0", sub_id="ooo-app") as sub,
    ):
        wanted = [int(n) for n in arg.split(",")] if mode == "crash" else []
        count = max(wanted) if mode == "crash" else int(arg)
        got: dict[int, HAMessage] = {}
        for _ in range(count):
            message = await sub.get(timeout=30)
            n = int(orjson.loads(message.data)["n"])
            got[n] = message
            say(f"got {n} {int(message.possible_duplicate)}")
            if mode == "resume":
                message.processed()
                say(f"processed {n}")
        if mode == "crash":
            for n in wanted:
                got[n].processed()
                say(f"processed {n}")
            os._exit(0)  # a crash: nothing closed, nothing synced
    store.close()
    say("done")


if __name__ == "__main__":
    trio.run(main, *sys.argv[1:6])
