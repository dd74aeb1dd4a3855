"""Training drafts for a target from self-distilled data (torch; the `export` extra)."""
