"""The analyze pipeline's glue: artifacts in and out of the blob store, the engine run with
progress and cancel, and the engine result turned into planner measurements.

The attempt child reads artifact rows and writes its output rows itself (fenced on the
job's attempt); everything else about the job row stays with the worker parent.
"""
