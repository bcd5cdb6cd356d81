-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE products (id BIGINT PRIMARY KEY, name STRING) WITH (topic='products');
