"""Logit processors, token distributions and exact rejection sampling (no Qt, numpy only)."""
