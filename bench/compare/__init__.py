"""`make bench`: statetable against Quix Streams, Flink SQL and Spark Structured Streaming."""
