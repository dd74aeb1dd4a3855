"""Torch-side tools: draft modules and export to OpenVINO (needs the `export` extra)."""
