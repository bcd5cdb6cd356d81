-- A join of the two tables from the database: each order with its customer's name and country
-- (a foreign-key join, keyed by the order). A customer renamed in the database rewrites exactly
-- their orders' rows; an order moved to another customer takes the other's name.
-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE shop_order_details AS
SELECT o.id, o.customer_id, o.amount, c.name, c.country
FROM shop_orders o
LEFT JOIN shop_customers c ON o.customer_id = c.id;
