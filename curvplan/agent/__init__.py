"""``curvplan agent``: run the team's own training command for the points of agent sweeps
(docs/budget.md#sweeps-with-your-own-trainer). Client side, torch-free: the command template
(:mod:`curvplan.agent.template`), one point's run (:mod:`curvplan.agent.run`) and the loop
(:mod:`curvplan.agent.loop`)."""
