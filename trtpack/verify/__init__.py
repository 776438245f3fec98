"""Verification: realistic inputs, per-sample task metrics, and comparing a candidate's outputs
with a reference's."""
