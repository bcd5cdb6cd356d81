-- Revenue per customer over the orders table: an order updated, moved to another customer or
-- deleted in the database retracts its old contribution. It equals
-- `SELECT customer_id, COUNT(*), SUM(amount) FROM orders GROUP BY customer_id` on the shop database.
-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE shop_revenue AS
SELECT customer_id, COUNT(*) AS orders, SUM(amount) AS revenue
FROM shop_orders
GROUP BY customer_id;
