"""The documentation's benchmark tables, made from `bench/results/*.json` (see `report.tables`):
`records` (result files and their provenance), `speed` (against llama.cpp, serving, GPU, history)
and `fidelity` (agreement, prompt cache, replica memory)."""
