"""The deterministic simulator (docs/SIMULATION.md): whole fabrics in one trio run on
a virtual clock, over a simulated network, with faults drawn from a seed.

* :mod:`amps_py.sim.network`: connections, latency, resets, partitions, crashes,
  half-open links, slow readers.
* :mod:`amps_py.sim.trace`: what happened, and its digest.
* :mod:`amps_py.sim.determinism`: trio's scheduling order drawn from the seed.
"""
