"""The engine process: claims runnable instances, runs their steps durably, and
checkpoints each step through the store (group-committed by the write batcher)."""
