-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE players (id BIGINT PRIMARY KEY, name STRING) WITH (topic='players');
