"""``python -m amps_py.cli`` = the ``amps-py`` command (as ``python -m amps_py``)."""

from amps_py.cli.app import main

main()
