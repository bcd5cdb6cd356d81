-- The catalogue: each title's genre. A title that changes genre moves its tickets between the
-- groups of tickets_per_genre; a title deleted (a tombstone) leaves them.
-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE movies (title STRING PRIMARY KEY, genre STRING) WITH (topic='movies');
