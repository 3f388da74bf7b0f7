"""Chapter 08's kit: plumbing for the worker scripts the chapter writes and launches.

The chapter's parallel code (process groups, DDP, FSDP2, TE's tensor, sequence and context
parallelism, a pipeline) is in the notebook itself, in worker files it writes and starts with
:func:`fp8lab.distributed.torchrun`. What is left here is not what the chapter teaches:

* :mod:`~fp8lab.parallel.ranks` -- the protocol's rounds run on every rank of a job, and their
  times read back as one :class:`fp8lab.protocol.Rounds`; a rank-0 JSON writer;
* :mod:`~fp8lab.parallel.projection` -- step times on more GPUs, anchored at a measured step
  (arithmetic, no torch), shared by the chapter and by the committed four-GPU prediction.

This package imports neither, so that a worker loads only what it uses.
"""
