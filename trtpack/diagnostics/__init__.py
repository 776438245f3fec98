"""``trtpack doctor`` (what this machine has) and ``trtpack inspect`` (what an engine or
repository is, and whether it runs here)."""
