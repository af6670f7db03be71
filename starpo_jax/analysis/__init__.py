"""Many runs: sweeps, the reproduction suite and its report."""
