"""`dflash-studio train-draft`: drafts trained for a target from its own answers (torch; the `export` extra)."""
