"""Records and rows as frames: transformations handed their inputs, never reading storage
(tests/test_layout.py holds it), so each can be built over in-memory data.

  arrow_pass     the Arrow pass over a batch's records: classify, filter, window, pre-aggregate
  arrow_values   records' JSON to typed Arrow columns, the strict block reader, the lone-record judge
  arrow_where    a table's WHERE as a pyarrow expression
  arrow_keys     key columns and their codec bytes, state partitions
  formats        a topic's values in another format (Avro) as the JSON both passes type
  parse          the Spark-SQL pass's reading and classification of records
  table_frames   a table's relational algebra in Spark SQL, shared by the batch and the history
"""
