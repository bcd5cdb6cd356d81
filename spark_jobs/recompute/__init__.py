"""A table recomputed from history: the reference that verify compares with and rebuild adopts.

  history   the recomputation itself: every input from its start, through the table's Pass
  verify    compare committed state with the recomputation, partition by partition in tasks,
            from the last verified checkpoint when there is one (delta/verify_chain.py)
  rebuild   recompute and adopt the result as the table's next commit, or adopt a changed
            definition beside the old state
"""
