-- The shop database's orders, from their change events: an update replaces the row, a delete
-- (and its tombstone) removes it, a primary-key change moves it.
-- format: debezium-json
-- partitions: 2
-- schedule: */5 * * * *
CREATE TABLE shop_orders (id BIGINT PRIMARY KEY, customer_id BIGINT, amount DOUBLE, status STRING,
                          placed_at TIMESTAMP)
WITH (topic='shop.public.orders');
