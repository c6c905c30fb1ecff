"""kvdoctor.rules: why decode is slow. The decision tree, the verdict catalogue, the diagnosis, the
actions, the thresholds, the PromQL compiler and the alerts. Pure: takes values, no I/O."""
