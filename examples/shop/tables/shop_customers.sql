-- The shop database's customers, as Debezium's PostgreSQL connector writes their changes
-- (`statetable cdc add shop public.customers public.orders`): each row upserted or deleted by
-- its primary key, so events a restarted connector sends again change nothing.
-- format: debezium-json
-- partitions: 2
-- schedule: */5 * * * *
CREATE TABLE shop_customers (id BIGINT PRIMARY KEY, name STRING, country STRING)
WITH (topic='shop.public.customers');
