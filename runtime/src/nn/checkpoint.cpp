// Checkpoints: in progress.
