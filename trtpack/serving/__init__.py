"""Triton model repositories: configs from Triton's own protobuf schema, and their layout.

(Not named ``triton``: a package or folder of that name shadows the ``triton`` package that
torch imports.)
"""
