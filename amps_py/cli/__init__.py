"""The ``amps-py`` command. Thin: every subcommand calls a library API.

amps-py serve [CONFIG | --config FILE] run an instance (embedded default without one;
                                       --allow-empty-journal: see docs/GUARANTEES.md)
amps-py config check FILE              validate a config without starting
amps-py config show-default            print the embedded default config
amps-py config examples [NAME]         list the shipped example configs, or write one out
amps-py config fabric DIR_OR_FILES...  check a whole replication fabric's routing
amps-py txlog info|dump|verify PATH    inspect a journal directory
amps-py txlog compress|archive|remove PATH ID   maintain a stopped instance's journals
amps-py publish URI TOPIC [DATA]       publish and wait for the persisted ack
amps-py subscribe URI TOPIC            print messages as JSON lines
amps-py sow [URI] TOPIC                print a SOW topic's records, one per line
amps-py users add|remove|list FILE ...  maintain an amps-password-file password file
amps-py pipeline stats JOURNAL...      topic and publisher statistics (Spark)
amps-py pipeline export JOURNAL OUT    journal records to Parquet, incrementally

URIs are tcp://host:port/amps/json, or tcps://... for a TLS transport (--ca-file names
the CA to trust when the server's certificate is not signed by a system CA). publish
and subscribe also take a comma-separated list of equivalent URIs (failover across it)
and --store DIR (durable: publish resumes after a crash, subscribe --resume continues
where the last run stopped); both run on the HA client then (``ha_publish``,
``ha_subscribe``). Client credentials: --user NAME and the password in
$AMPS_PY_PASSWORD, or tcp://user:password@host:port/amps/json. Long work shows progress
on stderr when it is a terminal, and nothing extra when piped.

Modules, each owning one thing (:mod:`amps_py.cli.app` puts them on :func:`main`):

- ``app``: the ``amps-py`` group itself, every command registered on it;
- ``serve``: ``amps-py serve``;
- ``publish``, ``subscribe``, ``sow``: the client commands on one server;
  ``ha_publish``, ``ha_subscribe``: publish and subscribe on the HA client (a URI
  list, ``--store``), ``ha`` their store directory and URI list, ``ha_session`` what
  the HA client tells the user while it runs;
- ``connect``: the client commands' shared options, credentials and error lines;
  ``payloads``: publish's input (DATA, the lines of --file, JSON checks);
  ``printing``: how subscribe prints a message; ``client``: credentials, refusal and
  persisted-wait explanations, sow lines; ``progress``: progress on a terminal;
- the command groups: ``config``, ``txlog``, ``users``, ``names``, ``admin``,
  ``pipeline``;
- ``common``: what every command module shares (``fail``, ``Pacer``).
"""

from amps_py.cli.app import main

__all__ = ["main"]
