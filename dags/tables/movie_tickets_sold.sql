-- topic: movie_ticket_sales
-- schema: title STRING, ticket_total_value DOUBLE, sale_ts TIMESTAMP
-- partitions: 4
-- schedule: */5 * * * *
-- max_records_per_batch: 1000000
-- snapshot_every: 10
-- output_topic: movie_tickets_sold_changes
CREATE TABLE movie_tickets_sold AS
SELECT title, COUNT(ticket_total_value) AS tickets_sold
FROM movie_ticket_sales
GROUP BY title;
