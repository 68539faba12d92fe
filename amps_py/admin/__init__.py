"""The HTTP admin interface: the AMPS-style ``/amps/...`` tree, administrator actions
and Prometheus ``/metrics`` (:mod:`.http`), and the ``amps-py admin`` console client
(:mod:`.console`)."""
