"""``/v1/agents``: ``curvplan agent`` processes claim and train the points of agent sweeps."""
