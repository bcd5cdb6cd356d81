"""The file spark-submit runs: `spark-submit ... spark_jobs/submit.py {run,verify,rebuild} TABLE`.

A thin launcher, so the job code is always imported as `spark_jobs.jobs`
and never also as `__main__` (two copies would hold two table locks).
"""
import sys

from spark_jobs.jobs import main

if __name__ == "__main__":
    sys.exit(main())
