"""amps-py: an open-source, AMPS-like message server.

Layout (one read tells where a message goes):

- ``amps_py.protocol``  sans-IO wire codec: bytes in, frames out (no trio, no sockets).
- ``amps_py.config``    AMPS-style XML -> frozen option objects, validated by config/amps.xsd.
- ``amps_py.filters``   the AMPS content-filter language: parser and evaluator.
- ``amps_py.server``    trio: listeners, client sessions, publish path, subscriptions, replay.
- ``amps_py.client``    trio client library used by the CLI, the tests and the benchmarks.
- ``amps_py.cli``       the ``amps-py`` command; thin, calls library APIs.
- ``txlog``             (top-level package) the LMDB journal; usable without the server.
"""

__version__ = "0.1.0"
