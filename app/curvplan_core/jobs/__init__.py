"""Job state shared by the API and the workers: the fan-out's status changes."""
