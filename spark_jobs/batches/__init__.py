"""The micro-batch, in the order it runs: plan, pass, merge, commit, after-commit.

  microbatch     MicroBatchRunner: orders the steps of one table's batches (start here)
  planning       a batch's plan: offsets per input fixed before a record is read, joins pinned, lag
  after_commit   what follows a commit entry: the mirror's change files, snapshots, offsets, upkeep

The runner asks the table's Pass (passes/) to run the batch; what the pass does is steps/.
"""
