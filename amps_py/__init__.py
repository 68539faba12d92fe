"""amps-py: an open-source, AMPS-like message server.

Layout (one read tells where a message goes; docs/ARCHITECTURE.md draws it):

- ``amps_py.protocol``     sans-IO wire codec and the frames the server sends.
- ``amps_py.config``       AMPS-style XML -> frozen option objects (``config.model``, no
                           lxml); one builder module per section; validated by amps.xsd.
- ``amps_py.filters``      the AMPS content-filter language: parser and evaluator.
- ``amps_py.sow``          State of the World: keys, delta merge, queries, the LMDB store
                           (pure; the server applies commits to it in ``server.sowing``).
- ``amps_py.queue``        message queues' delivery rules: leases, backlog, fairness,
                           barriers, ownership (pure; served by ``server.queues``).
- ``amps_py.server``       trio: ``instance`` wires listeners, sessions, the publish path
                           (``publishing``, ``durability``), the journal writer, delivery,
                           subscriptions, bookmark replay and journal maintenance.
- ``amps_py.replication``  peer links: pure link protocol, routing, validation, ack mode
                           and fabric check; trio outgoing/incoming drivers.
- ``amps_py.actions``      Actions: On / If / Do modules, run by the instance.
- ``amps_py.admin``        HTTP admin API, Prometheus metrics, the admin console.
- ``amps_py.client``       trio client library used by the CLI, the tests and benchmarks.
- ``amps_py.pipeline``     Spark data source, Parquet export, audit, statistics (optional).
- ``amps_py.cli``          the ``amps-py`` command; thin, calls library APIs.
- leaves: ``events`` (log event names), ``reasons`` (failure reasons), ``errors``,
  ``statistics`` (what an instance reports), ``units``, ``schedule``; ``auth``, ``logs``.
- ``txlog``                (top-level package) the LMDB journal; usable without the server.

Packages never import each other in a cycle (``tests/test_layout.py``): a part that
needs the instance takes a narrow ``Protocol`` (``server/host.py``,
``replication/host.py``, ``admin/host.py``, ``actions/host.py``).
"""

__version__ = "0.1.0"
