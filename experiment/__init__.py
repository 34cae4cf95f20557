"""experiment (see the README): the protocol's orchestrator and its search grids."""
