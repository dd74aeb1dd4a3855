"""DFlash Studio engine: block speculative decoding on the OpenVINO runtime (no Qt here)."""

__version__ = "0.1.0"  # the same as pyproject.toml [project] version (tests/engine/test_cli_errors.py checks)
