"""``python -m amps_py`` = the ``amps-py`` command."""

from amps_py.cli import main

main()
