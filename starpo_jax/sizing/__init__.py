"""How big a run is: memory estimates, the autofit of micro-batches and chunks, FLOPs."""
