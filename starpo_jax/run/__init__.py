"""Running an experiment: building it, the training loop, its config schema, evaluation,
monitoring, checkpoints, the workdir, the command line, writers."""
