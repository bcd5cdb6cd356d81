-- An aggregate over a table's rows: how many titles have sold each number of tickets, from
-- movie_ticket_totals (itself a table on movie_tickets_sold's change topic). A title that sells
-- again leaves its old count's group and joins its new one: its old contribution is retracted,
-- and a count no title has any more is deleted. FROM names the table; its schema, topic and key
-- come with it.
-- schedule: */5 * * * *
-- partitions: 2
CREATE TABLE titles_by_tickets_sold AS
SELECT tickets_sold, COUNT(*) AS titles, MIN(title) AS first_title, TOPK(3, title, title) AS last_titles
FROM movie_ticket_totals
GROUP BY tickets_sold;
