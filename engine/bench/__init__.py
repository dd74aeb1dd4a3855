"""Benchmarks: prompt sets, peers (openvino_genai) and result tables."""
