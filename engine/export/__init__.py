"""Export to OpenVINO: the draft IRs of engine/drafts' torch drafts, their head IRs, and targets (the `export` extra)."""
