"""Differential fuzzing of hyserve against llama.cpp (see test_fidelity_fuzz.py)."""
