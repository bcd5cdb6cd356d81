"""The Spark engine every job runs on.

  session          one way to build a SparkSession (Spark Connect or local) for every job
  arrow_batches    how many records go into each Arrow batch Spark hands to the pass
  partition_tasks  Spark jobs of one task per state partition (merge, verify's compare, stages)
  jvm_archive      a class-data archive for the job drivers' JVMs (Java's AppCDS)
"""
