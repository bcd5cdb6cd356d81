-- A table on a table: movie_tickets_sold's change topic (its `output_topic`), read as a source
-- table. Each record's key is the title as a JSON object, its value the row, a delete a tombstone.
-- schedule: */5 * * * *
-- partitions: 2
-- key_format: json
CREATE TABLE movie_ticket_totals (title STRING PRIMARY KEY, tickets_sold BIGINT)
WITH (topic='movie_tickets_sold_changes');
