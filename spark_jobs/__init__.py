"""The Spark layer: a table's micro-batches, its recomputation from history, and the engine.

A newcomer's map, by wing, top floor first (each wing's __init__ lists its modules; a module
imports its own wing and the floors below, tests/test_layout.py holds it):

  batches/    the micro-batch in order: plan -> pass -> merge -> commit -> after-commit
              (batches/microbatch.py is the runner: start there)
  recompute/  the table from history: verify and rebuild (beside batches/, over the passes)
  passes/     a table kind is a Pass; `pass_for` is the one place that asks a table's kind
  steps/      a pass's work over one batch, step by step, and what the steps share
  delta/      what a table keeps beside its state: bronze, mirror, dead letters, checkpoints
  frames/     transformations of records and rows (the Arrow pass, parsing, table frames), no I/O
  engine/     Spark sessions, Arrow batch sizes, per-partition tasks, the JVM archive

Entry points, over every wing:
  jobs           the CLI's and the tasks' main (run, restore, query, verify, rebuild)
  submit         the file spark-submit runs; smoke: the first end-to-end job
  warmup         the engine's warm-up: one small batch of a scratch table before it reports up
  worker_daemon  pyspark's worker daemon, the Arrow pass and the merge task imported before the fork
And under all of them, errors: the named errors of the jobs.
"""
