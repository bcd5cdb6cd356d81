-- topic: payments
-- schema: customer_id STRING, amount DOUBLE, payment_ts TIMESTAMP
-- partitions: 4
-- schedule: */5 * * * *
CREATE TABLE payments_per_customer AS
SELECT customer_id, COUNT(amount) AS payments, SUM(amount) AS total, MAX(amount) AS largest
FROM payments
GROUP BY customer_id;
