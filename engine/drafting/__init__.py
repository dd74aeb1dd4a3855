"""Turning draft rows into candidates: argmax, the Top-K candidate scorer, the dense Markov walk."""
