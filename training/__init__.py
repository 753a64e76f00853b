"""The training loop's plumbing: config checks, optimizer and schedule, checkpoints, metrics, the loop."""
