"""The server side of the AMPS client protocol, sans-IO.

:mod:`.connection` (:class:`ServerConnection`: decoding, logon state, command
validation), :mod:`.commands` (reading a command's header), :mod:`.logon` (the logon's
rules), :mod:`.acks` (which acks a command is owed, and their bytes) and
:mod:`.heartbeat` (heartbeat timing). No trio, no sockets, no clocks: the driver is
:mod:`amps_py.server.session`.
"""
