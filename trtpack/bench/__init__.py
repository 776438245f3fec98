"""``trtpack bench``: latency per profile corner of a finished build, in its runtimes and through
a served Triton, timed the same way."""
