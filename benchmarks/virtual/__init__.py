"""The virtual cluster: P ranks as threads of one process, on a virtual clock, running the real code.

Each rank is a thread that runs the same training loop, the same algorithm and the same calls to
``torch.distributed`` as a rank of a real job. Its process groups carry the tensors between the
threads, exactly, and charge each operation what the network model says it costs. Every rank has
its own clock; the loop advances it by the compute time model at each batch, and a communication
ends at the virtual time the network gives. So an algorithm's rule is written once: what is
simulated is time, never arithmetic.

The package, one concern a module:

- ``scheduler``: the conservative discrete-event scheduler (one actor at a time, by virtual time);
- ``threads``: ``threading``'s Thread, Lock, Event and Condition on the virtual clock, and
  ``torch.distributed``'s state per thread;
- ``group``: the process group (collectives, messages), registered as the backend ``virtual``;
- ``network``: the network model (links, presets, what each collective costs);
- ``clock``: a rank's clock (compute time, DDP's overlap with backward, Hogwild counters);
- ``flows``: transfers that share links, max-min fairly;
- ``job``: what a job's ranks share, and running them (``run``, ``run_job``).

The commands that measure the model live above the runner, in ``tools``: ``python -m
tools.calibrate`` fits this machine's network and batch time and holds the model against it;
``python -m tools.validate`` holds it against measurements it was not fitted to.
"""
