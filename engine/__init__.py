"""DFlash Studio engine: block speculative decoding on the OpenVINO runtime (no Qt here)."""
