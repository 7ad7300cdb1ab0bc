"""The protocol: the partition writer, the coordinator's decision, commit, sweep and
recovery, operations on groups of branches, the apply step, multi-target transactions, run liveness and xids."""
