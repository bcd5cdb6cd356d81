"""What a table keeps on storage beside its state: the Delta tables (bronze, the mirror of its
state, the dead letters), their upkeep, and verify's checkpoints.

  delta_files        Parquet files written whole or not at all, committed to Delta in one transaction
  mirror             the Delta mirror of a table's state: an append-only changes table, folded
  delta_maintenance  compaction, vacuum and bronze's trim, so each stays small
  verify_chain       verified checkpoints: what a verify found exact is not recomputed again
"""
