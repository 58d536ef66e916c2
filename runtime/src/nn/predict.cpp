// Filled by the Evaluate work in progress.
